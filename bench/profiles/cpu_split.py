"""The daemon's CPU per kernel call split into user and system time: one daemon
(container backend off, rate limit off), a session whose kernel runs ``x += 1; print(x)``
over HTTP, and the daemon's utime and stime from ``/proc/<pid>/stat`` around
``--calls`` calls, ``--rounds`` times. User time is Python (the GIL-held samples of a py-spy
``--gil`` profile); system time is the system calls (the audit log's ``fdatasync``, ``/proc``
reads, sockets, futexes). The fork floor of the same run (``bench_daemon``'s) is printed last.

    PYTHONPATH=$PWD .venv/bin/python bench/profiles/cpu_split.py [--rounds 3] [--calls 500]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "bench"))
sys.path.insert(0, str(HERE / "bench" / "profiles"))

import bench_daemon as bd  # noqa: E402
import bench_kernel_restricted as bkr  # noqa: E402
import httpx  # noqa: E402
from profile_kernel_call import ENV  # noqa: E402  (the daemon as the profile runs it)

from tests.support.daemon import running_daemon  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=500)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_daemon(Path(tmp), env=ENV) as daemon, \
            httpx.Client(base_url=daemon.url, timeout=60) as client:
        counter = bkr.Counter(client)
        for _ in range(20):
            counter.step()
        for n in range(args.rounds):
            u0, s0 = bd.cpu_times(daemon.proc.pid)
            for _ in range(args.calls):
                counter.step()
            u1, s1 = bd.cpu_times(daemon.proc.pid)
            per = 1000 / args.calls
            print(f"round {n + 1}: user {(u1 - u0) * per:.2f} ms, system "
                  f"{(s1 - s0) * per:.2f} ms per call", flush=True)
    floor = sorted(bd.floor_once() for _ in range(21))[10] * 1000
    print(f"fork floor ({' '.join(bd.FLOOR)}) p50 {floor:.2f} ms; "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
