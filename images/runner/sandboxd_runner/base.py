"""What every part of the runner shares: prctl(PR_SET_DUMPABLE), the cgroup's OOM and pids
counters, oom_score_adj, program lookup on PATH and killing a call's process group."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_DUMPABLE = 4


def site_dirs() -> list[str]:
    """The image's site-packages directories, which ``-S`` leaves out: what an image installs
    (numpy, pandas, ... in sandboxd/datascience) must be importable. Appended after the
    standard library (nothing there can shadow it) and without running their .pth files."""
    import site  # under -S, importing site does not run site.main()

    return [p for p in site.getsitepackages() if os.path.isdir(p) and p not in sys.path]


_libc = ctypes.CDLL(None, use_errno=True)


def set_dumpable(flag: int) -> bool:
    """prctl(PR_SET_DUMPABLE): 0 keeps same-uid processes out of our /proc and ptrace."""
    rc: int = _libc.prctl(PR_SET_DUMPABLE, flag, 0, 0, 0)
    return rc == 0


# ------------------------------------------------------------------ cgroup counters


def _read_key(paths: tuple[str, ...], key: str) -> int:
    for path in paths:
        try:
            with open(path) as fh:
                for line in fh:
                    parts = line.split()
                    if len(parts) == 2 and parts[0] == key:
                        return int(parts[1])
        except (OSError, ValueError):
            continue
    return 0


def _existing(*paths: str) -> tuple[str, ...]:
    return tuple(p for p in paths if os.path.exists(p))


# found once in the runner; handlers inherit them (cgroup v2 first, then v1)
OOM_FILES = _existing("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
PIDS_FILES = _existing("/sys/fs/cgroup/pids.events", "/sys/fs/cgroup/pids/pids.events")


def cgroup_counters() -> tuple[int, int]:
    """(oom kills, pids-limit hits) of this container's cgroup (v2 or v1)."""
    return _read_key(OOM_FILES, "oom_kill"), _read_key(PIDS_FILES, "max")


def find_program(argv0: str, path: str) -> str | None:
    if "/" in argv0:
        return argv0
    for d in path.split(":"):
        candidate = os.path.join(d or ".", argv0)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _open_oom_score_adj() -> int | None:
    """Opened while still dumpable: a non-dumpable process's /proc/self files are root's."""
    try:
        return os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return None


OOM_ADJ_FD = _open_oom_score_adj()


def set_oom_score_adj(value: str) -> bool:
    if OOM_ADJ_FD is None:
        return False
    try:
        os.write(OOM_ADJ_FD, value.encode())
        return True
    except OSError:
        return False


def wait_group_gone(pgid: int, wait_s: float = 0.3) -> bool:
    """True once no process of process group ``pgid`` is left (they were SIGKILLed)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = False
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            # fields: state ppid pgrp ...; zombies are gone as far as resources go
            if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
                left = True
                break
        if not left:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
