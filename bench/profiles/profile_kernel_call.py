"""Profile a daemon under a kernel-call loop (where its per-call CPU
goes): py-spy records it (raw collapsed
stacks) while one client runs ``x += 1; print(x)`` in a session kernel over HTTP.

    python bench/profiles/profile_kernel_call.py <checkout> <out.raw> [--seconds 10]

``<checkout>``: the tree whose daemon is profiled (on its ``PYTHONPATH``). Needs ``py-spy``
(PyPI) beside this interpreter."""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "bench"))

import bench_kernel_restricted as bkr  # noqa: E402

from tests.support.daemon import running_daemon  # noqa: E402

ENV = {"SANDBOXD_RATE_LIMIT_PER_MINUTE": "0", "SANDBOXD_CONTAINER_ENABLED": "false"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tree", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds", type=float, default=10)
    # more py-spy options after ``--``, e.g. ``-- --gil`` (a positional ``nargs="*"`` before
    # ``--`` is taken as empty by argparse, which then refuses what follows)
    args, spy_args = ap.parse_known_args()
    args.spy_args = [a for a in spy_args if a != "--"]
    spy_bin = Path(sys.executable).with_name("py-spy")
    with (
        tempfile.TemporaryDirectory() as tmp,
        contextlib.chdir(args.tree),  # python -m sandboxd imports from there first
        running_daemon(Path(tmp), env={**ENV, "PYTHONPATH": str(args.tree.resolve())}) as d,
        httpx.Client(base_url=d.url, timeout=60) as client,
    ):
        counter = bkr.Counter(client)
        for _ in range(20):
            counter.step()
        spy = subprocess.Popen([str(spy_bin), "record", "-r", "500", "-p", str(d.proc.pid),
                                "-f", "raw", "-o", str(args.out), "--nonblocking", *args.spy_args],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.5)  # py-spy attached
        t0, n = time.monotonic(), 0
        while time.monotonic() - t0 < args.seconds:
            counter.step()
            n += 1
        spy.send_signal(signal.SIGINT)
        spy.wait()
        print(f"{n} calls in {args.seconds:.0f} s; profile in {args.out}")


if __name__ == "__main__":
    main()
