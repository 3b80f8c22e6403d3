"""Daemon start-up: ``sandboxd serve`` from exec to a 200 on ``/healthz``, and the import of
what ``serve`` loads, medians over repeated runs. Every test daemon pays this, ~30x slower
under the VM job's emulation, where CI runs hundreds of them.

    python bench/bench_startup.py [--runs 9] [--baseline /path/to/other/checkout]

``--baseline``: the same measures of another checkout (e.g. a ``git worktree`` of an older
commit), interleaved run by run with this one, so that both see the same machine load."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from tests.support.daemon import TEST_DEFAULTS, free_port  # noqa: E402

IMPORTS = "import sandboxd.cli, sandboxd.api.app"


def env_for(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    env.update(TEST_DEFAULTS, SANDBOXD_CONFIG=os.devnull, PYTHONPATH=str(tree))
    return env


def import_s(tree: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORTS], env=env_for(tree), check=True)
    return time.perf_counter() - t0


def start_s(tree: Path) -> float:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandboxd", "serve", "--host", "127.0.0.1", "--port",
             str(port), "--state-dir", tmp], env=env_for(tree), cwd=tree,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{tree}: the daemon exited with {proc.returncode}")
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                        return time.perf_counter() - t0
                except httpx.HTTPError:
                    pass
                time.sleep(0.01)
        finally:
            proc.terminate()
            proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--baseline", type=Path, help="another checkout, measured interleaved")
    args = ap.parse_args()
    trees = {"this": HERE, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    # the fork floor of this run: a bare interpreter, start to exit
    floor = []
    results: dict[str, dict[str, list[float]]] = {n: {"import": [], "start": []} for n in trees}
    for _ in range(args.runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        floor.append(time.perf_counter() - t0)
        for name, tree in trees.items():
            results[name]["import"].append(import_s(tree))
            results[name]["start"].append(start_s(tree))
    fl = statistics.median(floor)
    print(f"python -c pass (floor): {fl * 1000:.0f} ms  ({args.runs} runs, medians)")
    print(f"{'tree':<10} {'import (ms)':>11} {'start to healthy (ms)':>22} {'÷ floor':>8}")
    for name, r in results.items():
        imp, st = statistics.median(r["import"]), statistics.median(r["start"])
        print(f"{name:<10} {imp * 1000:>11.0f} {st * 1000:>22.0f} {st / fl:>8.1f}")


if __name__ == "__main__":
    main()
