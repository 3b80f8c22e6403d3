"""How the container runner starts one plain command (``true``), inside the sandbox image:
``posix_spawn`` (the fast path: the runner's own rlimits are the call's) against a fork whose
worker sets the call's rlimits and execs (what a call whose ``open_files`` is below the
runner's own descriptor limit takes). Both interleaved, medians; the fork floor of a process
is the same run's second row.

    python bench/bench_runner_spawn.py [--runs 400] [--image sandboxd/python:latest]

Run on the host: it starts one ``docker run`` of the image with this file mounted and runs
itself there (``--inside``) with the runner's own modules."""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time
from pathlib import Path

DOCKER = "/usr/bin/docker"


def inside(runs: int) -> None:
    sys.path.insert(0, "/opt/sandboxd")
    from sandboxd_runner import main as runner_main
    from sandboxd_runner.rlimits import requested_rlimits
    from sandboxd_runner.worker import spawn_command, worker

    sys.path.extend(runner_main.site_dirs())
    gc.collect()
    gc.freeze()
    from sandboxd.protocol.call import WorkerRequest
    from sandboxd.protocol.plan import Plan

    req = WorkerRequest(kind="plan", cwd=os.getcwd(), env={"PATH": "/usr/bin:/bin"},
                        plan=Plan.single(["true"]))
    rlimits = requested_rlimits(req.limits.rlimits())

    def one(fast: bool) -> float:
        r, w = os.pipe()
        started = time.perf_counter()
        pid = spawn_command(req, w, w, () if fast else rlimits)
        if pid is None:
            pid = os.fork()
            if pid == 0:
                worker(req, w, w, None, None, rlimits)
        os.close(w)
        os.waitpid(pid, 0)
        took = time.perf_counter() - started
        os.close(r)
        return took

    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(runs):
        for fast in (True, False):
            times[fast].append(one(fast))
    for fast, xs in times.items():
        xs.sort()
        name = "posix_spawn (no rlimits to set)" if fast else "fork + rlimits + exec"
        print(f"{name:32} median {xs[len(xs) // 2] * 1e3:.2f} ms  "
              f"p90 {xs[int(len(xs) * 0.9)] * 1e3:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--image", default="sandboxd/python:latest")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inside:
        inside(args.runs)
        return
    here = Path(__file__).resolve()
    subprocess.run([DOCKER, "run", "--rm", "--network", "none",
                    "-v", f"{here}:/tmp/bench_runner_spawn.py:ro", "--entrypoint", "python3",
                    args.image, "-I", "-S", "/tmp/bench_runner_spawn.py", "--inside",
                    "--runs", str(args.runs)], check=True)


if __name__ == "__main__":
    main()
