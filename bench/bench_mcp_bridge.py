"""The stdio bridge's start-up: ``sandboxd mcp --url ...`` from exec to the answer to the
host's first request (``initialize`` at 2025-11-25, ``server/discover`` at 2026-07-28), sent
the moment the process starts, as a host does. Medians over repeated runs, against a real
daemon started once, with the fork floor (``python -c pass``) of the same run.
The answer is due within 1 s of start: a host waits for it before it shows any tool.

    python bench/bench_mcp_bridge.py [--runs 5] [--baseline /path/to/other/checkout]

``--baseline``: the same measures of another checkout (e.g. a ``git worktree`` of main),
interleaved run by run with this one, against the same daemon."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from sandboxd.access.tokens import add_token  # noqa: E402
from tests.support.daemon import running_daemon  # noqa: E402

FIRST = {
    "initialize": {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "bench", "version": "0"}}},
    "discover": {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"}}}},
}


def env_for(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    env["PYTHONPATH"] = str(tree)
    return env


def floor_s() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t0


def answer_s(tree: Path, url: str, token_file: Path, first: str) -> float:
    """Exec to the first answer line on stdout; the bridge is then ended by closing stdin."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandboxd", "mcp", "--url", url, "--token-file", str(token_file)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=env_for(tree), cwd=tree)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write((json.dumps(FIRST[first]) + "\n").encode())
        proc.stdin.flush()
        line = proc.stdout.readline()
        took = time.perf_counter() - t0
        answer = json.loads(line)
        if "result" not in answer:
            raise RuntimeError(f"{tree}: {first} was answered {answer}")
        return took
    finally:
        proc.stdin.close()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="another checkout, measured interleaved")
    args = ap.parse_args()
    trees = {"this": HERE, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        shutil.copytree(HERE / "policies", tmp / "policies")
        token = add_token(tmp / "tokens.yaml", "bench")
        token_file = tmp / "bench.token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        with running_daemon(tmp, policies_dir=tmp / "policies", token=token,
                            env={"SANDBOXD_TOKENS_FILE": str(tmp / "tokens.yaml")}) as d:
            for first in FIRST:  # the daemon's door is loaded on its first MCP request
                for tree in trees.values():
                    with contextlib.suppress(RuntimeError, ValueError):
                        answer_s(tree, d.url, token_file, first)
            floor: list[float] = []
            results: dict[str, dict[str, list[float]]] = {n: {k: [] for k in FIRST}
                                                          for n in trees}
            for _ in range(args.runs):
                floor.append(floor_s())
                for name, tree in trees.items():
                    for first in FIRST:
                        # a bridge that refuses discover (an older checkout) has no figure
                        with contextlib.suppress(RuntimeError, ValueError):
                            took = answer_s(tree, d.url, token_file, first)
                            results[name][first].append(took)
    fl = statistics.median(floor)
    print(f"python -c pass (floor): {fl * 1000:.0f} ms  ({args.runs} runs, medians)")
    print(f"{'tree':<10} {'start to initialize (ms)':>25} {'start to discover (ms)':>23}")
    for name, r in results.items():
        cells = [f"{statistics.median(r[k]) * 1000:.0f}" if r[k] else "refused" for k in FIRST]
        print(f"{name:<10} {cells[0]:>25} {cells[1]:>23}")


if __name__ == "__main__":
    main()
