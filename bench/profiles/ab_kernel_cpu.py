"""The daemon's CPU per kernel call alone, for two or more checkouts interleaved
run by run (alternating order): one daemon per run (container backend off), ``--calls``
stateful kernel calls over HTTP after ten to warm up, the daemon's CPU from ``/proc``.

    python bench/profiles/ab_kernel_cpu.py [--runs 6] [--calls 300] <checkout> <checkout>...
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "bench"))

import bench_daemon as bd  # noqa: E402

from tests.support.daemon import running_daemon  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("trees", type=Path, nargs="+")
    args = ap.parse_args()
    trees = [t.resolve() for t in args.trees]
    results: dict[Path, list[tuple[float, float]]] = {t: [] for t in trees}
    print(f"load average {os.getloadavg()[0]:.1f}", flush=True)
    for run in range(args.runs):
        for tree in trees if run % 2 == 0 else trees[::-1]:
            env = {**bd.ENV, "PYTHONPATH": str(tree), "SANDBOXD_CONTAINER_ENABLED": "false",
                   "SANDBOXD_INSTANCE": f"ab{secrets.token_hex(4)}"}
            with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tree), \
                    running_daemon(Path(tmp), env=env) as daemon:
                results[tree].append(bd.kernel_calls(daemon, args.calls))
            p50, cpu = results[tree][-1]
            print(f"run {run + 1} {tree}: p50 {p50:.2f} ms, CPU {cpu:.3f} ms", flush=True)
    for tree, runs in results.items():
        print(f"{tree}: CPU per call {statistics.median(c for _, c in runs):.2f} ms "
              f"({', '.join(f'{c:.2f}' for _, c in runs)}), "
              f"p50 {statistics.median(p for p, _ in runs):.2f} ms")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
