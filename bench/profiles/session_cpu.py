"""Where the CPU of one session's creation and first result goes, split by process: the
client (this process), the daemon, the zygote (with the workers it reaped), the other helpers
(the mount helper), and what is left of the machine's busy time (the kernels, alive at the
end, and the kernel threads). With ``--perf``, a system-wide ``perf record`` of the same
sessions (Debian's ``linux-perf``, not in the project's install list) adds each process
role's share of samples spent in page faults (a kernel's are mostly copy-on-write copies of
the zygote's pages) and its top system calls.

A real daemon (restricted backend only, rate limit off), ``--sessions`` created one after
another, each with its first ``python`` call (``bench_scale``'s: a 10,000-item list); the
zygote floor of the same run (``../shared/bench/zygote_floor.py``) is printed first.

    PYTHONPATH=$PWD .venv/bin/python bench/profiles/session_cpu.py [--sessions 300] [--perf]
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "bench"))

from bench_receipts import zygote_floor_ms  # noqa: E402
from bench_scale import FLOOR, Harness  # noqa: E402

from tests.support.daemon import running_daemon  # noqa: E402

ENV = {"SANDBOXD_MAX_SESSIONS_PER_CLIENT": "5000", "SANDBOXD_RATE_LIMIT_PER_MINUTE": "0",
       "SANDBOXD_CONTAINER_ENABLED": "false", "SANDBOXD_SANDBOX_UID_FIRST": "41000"}


def busy_ticks() -> tuple[int, int, int]:
    """(busy, user, system) clock ticks of the whole machine so far."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(v) - v[3] - v[4], v[0] + v[1], v[2] + v[5] + v[6]


def cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def roles(daemon: int) -> dict[int, str]:
    """The daemon, its zygote (the helper with children) and its other helpers."""
    out = {daemon: "daemon", os.getpid(): "client"}
    for p in psutil.Process(daemon).children():
        out[p.pid] = "zygote" if p.children() else "helper"
    return out


def perf_split(data: Path, named: dict[int, str]) -> None:
    """Samples per role (``kernel``: any other python process), the share in page faults, and
    the top system calls, from ``perf script``."""
    text = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,pid,ip,sym"],
                          capture_output=True, text=True, check=True).stdout
    total: collections.Counter[str] = collections.Counter()
    faults: collections.Counter[str] = collections.Counter()
    calls: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for block in text.split("\n\n"):
        lines = block.strip().splitlines()
        if not lines or not lines[0].startswith("python"):
            continue
        role = named.get(int(lines[0].split()[1]), "kernel")
        syms = [ln.split()[1] for ln in lines[1:] if len(ln.split()) > 1]
        total[role] += 1
        if any("page_fault" in s for s in syms):
            faults[role] += 1
        top = next((s for s in reversed(syms) if s.startswith(("__x64_sys_", "__do_sys_"))),
                   None)
        if top:
            calls[role][top] += 1
    for role, n in total.most_common():
        common = ", ".join(f"{k.split('sys_')[-1]} {v * 100 // n}%"
                           for k, v in calls[role].most_common(4))
        print(f"  {role}: {n} samples, {faults[role] * 100 // n}% in page faults; system "
              f"calls: {common}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=300)
    ap.add_argument("--floor", type=Path, default=FLOOR)
    ap.add_argument("--perf", action="store_true", help="also a system-wide perf record")
    args = ap.parse_args()
    print(f"zygote floor (same run): p50 {zygote_floor_ms(args.floor, 200):.2f} ms")
    with tempfile.TemporaryDirectory(prefix="session-cpu-") as tmp:
        os.chmod(tmp, 0o755)
        with running_daemon(Path(tmp), env=ENV) as d:
            h = Harness(d)
            for _ in range(10):
                h.create_and_call()
            named = roles(d.proc.pid)
            perf = None
            data = Path(tmp) / "perf.data"
            if args.perf:
                perf = subprocess.Popen(["perf", "record", "-a", "-g", "-F", "999", "-q", "-o",
                                         str(data)], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
                time.sleep(1)  # perf opens its events before the first session
            before = {pid: cpu_s(pid) for pid in named}
            b0, u0, s0 = busy_ticks()
            start = time.perf_counter()
            for _ in range(args.sessions):
                h.create_and_call()
            wall = time.perf_counter() - start
            b1, u1, s1 = busy_ticks()
            used = {role: 0.0 for role in named.values()}
            for pid, role in named.items():
                used[role] += cpu_s(pid) - before[pid]
            if perf is not None:
                perf.send_signal(2)
                perf.wait()
            n, hz = args.sessions, os.sysconf("SC_CLK_TCK")
            busy = (b1 - b0) / hz
            print(f"{n} sessions one after another: wall {wall / n * 1000:.2f} ms each; "
                  f"machine busy {busy / n * 1000:.2f} ms each (user "
                  f"{(u1 - u0) / hz / n * 1000:.2f}, system {(s1 - s0) / hz / n * 1000:.2f})")
            for role, s in used.items():
                print(f"  {role}: {s / n * 1000:.2f} ms each")
            print(f"  the rest (kernels, kernel threads): "
                  f"{(busy - sum(used.values())) / n * 1000:.2f} ms each")
            if perf is not None:
                perf_split(data, named)


if __name__ == "__main__":
    main()
