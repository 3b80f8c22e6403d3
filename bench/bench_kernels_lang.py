"""A session kernel call in each language on the container backend, in the same run: bash
(``echo 1``) and javascript (``console.log(1)``, in the javascript profile's image) against
python (``print(1)``), each in its own session's kernel (warm: the
container and the kernel started by the first calls), over HTTP through a real daemon, with
the zygote floor of the same run (``../shared/bench/zygote_floor.py``, a pre-imported process
that forks per request, no isolation; its path: ``--floor``). The images: the daemon's
settings (``SANDBOXD_PYTHON_IMAGE`` / ``SANDBOXD_SHELL_IMAGE`` name others).

    python bench/bench_kernels_lang.py [--calls 100] [--floor PATH]

Target: a bash or javascript kernel call <= 1.2 x a python kernel call."""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(HERE), str(HERE / "bench")]

from bench_receipts import FLOOR, zygote_floor_ms  # noqa: E402

from tests.support.daemon import RunningDaemon, running_daemon  # noqa: E402

POLICY = """\
version: 1
name: bench-languages
clients: ["*"]
tools:
  python: {backend: container}
  shell: {backend: container, commands: {allow: [echo]}}
  bash: {backend: container}
  javascript: {backend: container}
"""
TARGET = 1.2
CALLS = {"python": "print(1)", "bash": "echo 1", "javascript": "console.log(1)"}


def kernel_call_ms(d: RunningDaemon, tool: str, calls: int) -> float:
    """p50 of one call of ``tool`` in a warm session kernel (ms)."""
    sid = d.client.post("/v1/sessions", json={}).json()["id"]
    body = {"arguments": {"code": CALLS[tool]}, "session": sid}
    times = []
    for i in range(calls + 5):  # the first start the container and the kernel
        t0 = time.perf_counter()
        r = d.client.post(f"/v1/tools/{tool}/invoke", json=body, timeout=120)
        if i >= 5:
            times.append(time.perf_counter() - t0)
        res = r.json()
        assert r.status_code == 200 and res["status"] == "ok" and res["stdout"] == "1\n", r.text
        assert res["kernel"]["fresh"] is (i == 0), res
    d.client.delete(f"/v1/sessions/{sid}")
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--floor", type=Path, default=FLOOR)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        policies = Path(tmp) / "policies"
        policies.mkdir()
        (policies / "bench.yaml").write_text(POLICY)
        env = {"SANDBOXD_INSTANCE": f"bl{secrets.token_hex(4)}"}
        for name in ("SANDBOXD_PYTHON_IMAGE", "SANDBOXD_SHELL_IMAGE"):
            if name in os.environ:
                env[name] = os.environ[name]
        with running_daemon(Path(tmp), policies_dir=policies, env=env) as d:
            # alternate the languages, so that the host's load weighs on both alike
            got: dict[str, list[float]] = {tool: [] for tool in CALLS}
            for _ in range(3):
                for tool in got:
                    got[tool].append(kernel_call_ms(d, tool, args.calls // 3))
    floor_ms = zygote_floor_ms(args.floor, args.calls)
    p50 = {tool: statistics.median(times) for tool, times in got.items()}
    print(f"session kernel calls on the container backend, over HTTP, 3 x {args.calls // 3} "
          f"warm calls each; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"  python {CALLS['python']}, p50: {p50['python']:.2f} ms")
    for tool in CALLS:
        if tool != "python":
            ratio = p50[tool] / p50["python"]
            print(f"  {tool} {CALLS[tool]}, p50: {p50[tool]:.2f} ms: {ratio:.2f} x python "
                  f"(target <= {TARGET} x: {'met' if ratio <= TARGET else 'MISSED'})")
    print(f"  zygote floor (fork per request, no isolation), p50: {floor_ms:.2f} ms")


if __name__ == "__main__":
    main()
