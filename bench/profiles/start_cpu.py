"""The CPU a daemon's start takes (CI's emulated VM job starts
hundreds): ``sandboxd serve`` (embedded
default policy, default settings, a fresh state directory) from exec to its READY=1 on an
sd_notify socket, its own utime + stime from /proc; checkouts measured interleaved, with the
fork floor (``python -I -S -c pass``, its CPU as a child) of the same run. ``--command``:
also an admin command's whole run (``python -m sandboxd <command>``, its CPU as a child).

    .venv/bin/python bench/profiles/start_cpu.py --runs 7 $PWD /path/to/other-checkout
    .venv/bin/python bench/profiles/start_cpu.py --no-start --command "audit --help" \
        --command version $PWD /path/to/other-checkout
"""

from __future__ import annotations

import argparse
import os
import resource
import secrets
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / TICK


def one_start(tree: str) -> tuple[float, float]:
    """(CPU ms, wall ms) of one daemon start of ``tree``."""
    name = f"start-cpu-{secrets.token_hex(4)}"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind("\0" + name)
    notify.settimeout(120)
    with tempfile.TemporaryDirectory(prefix="sandboxd-start-") as state:
        env = {**os.environ, "PYTHONPATH": tree, "NOTIFY_SOCKET": "@" + name,
               "SANDBOXD_CONFIG": os.devnull}
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandboxd", "serve", "--host", "127.0.0.1", "--port",
             str(20000 + secrets.randbelow(20000)), "--state-dir", state],
            env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while b"READY=1" not in notify.recv(4096):
                pass
            wall = (time.monotonic() - t0) * 1000
            cpu = cpu_ms(proc.pid)
        finally:
            proc.terminate()
            proc.wait()
            notify.close()
    return cpu, wall


def child_cpu_ms(argv: list[str], env: dict[str, str] | None = None,
                 cwd: str | None = None) -> float:
    """CPU ms of running ``argv`` to its end (a child's utime + stime)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env, cwd=cwd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1000


def floor_ms() -> float:
    """CPU ms of ``python -I -S -c pass`` (fork, exec, interpreter start)."""
    return child_cpu_ms([sys.executable, "-I", "-S", "-c", "pass"])


def one_command(tree: str, command: str) -> float:
    """CPU ms of ``python -m sandboxd <command>`` of ``tree``, to its end."""
    env = {**os.environ, "PYTHONPATH": tree, "SANDBOXD_CONFIG": os.devnull}
    return child_cpu_ms([sys.executable, "-m", "sandboxd", *shlex.split(command)], env=env,
                        cwd=tree)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--command", action="append", default=[],
                        help="an admin command to measure too, e.g. 'audit --help'")
    parser.add_argument("--no-start", action="store_true", help="no daemon start")
    parser.add_argument("trees", nargs="+")
    args = parser.parse_args()
    starts: dict[str, list[tuple[float, float]]] = {t: [] for t in args.trees}
    commands: dict[tuple[str, str], list[float]] = {
        (t, c): [] for t in args.trees for c in args.command}
    for tree in args.trees:  # bytecode for every tree: a shell's PYTHONDONTWRITEBYTECODE=1
        # would leave a fresh worktree compiling every module at every run
        subprocess.run([sys.executable, "-m", "compileall", "-q", f"{tree}/sandboxd"],
                       check=True)
    floors = []
    for _ in range(args.runs):
        floors.append(statistics.median(floor_ms() for _ in range(5)))
        for tree in args.trees:
            if not args.no_start:
                starts[tree].append(one_start(tree))
            for command in args.command:
                commands[tree, command].append(one_command(tree, command))
    floor = statistics.median(floors)
    print(f"fork floor (python -I -S -c pass): CPU p50 {floor:.1f} ms")
    for tree, runs in starts.items():
        if not runs:
            continue
        cpu = statistics.median(r[0] for r in runs)
        wall = statistics.median(r[1] for r in runs)
        print(f"{tree}: start to READY=1: CPU p50 {cpu:.0f} ms ({cpu / floor:.1f}x the floor), "
              f"wall p50 {wall:.0f} ms")
    for (tree, command), cpus in commands.items():
        cpu = statistics.median(cpus)
        print(f"{tree}: sandboxd {command}: CPU p50 {cpu:.0f} ms ({cpu / floor:.1f}x the floor)")


if __name__ == "__main__":
    main()
