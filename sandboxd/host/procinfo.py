"""The two process facts the daemon reads from ``/proc`` on its own: psutil, 0.7 MiB of memory
for the daemon's lifetime, was imported for these alone."""

from __future__ import annotations

import math
import select
from pathlib import Path

PROC = Path("/proc")


def parent_and_state(pid: int) -> tuple[int, str] | None:
    """``(ppid, state letter)`` of a live (or zombie) process, None when there is none.
    Other read errors (``EACCES``...) raise ``OSError``."""
    try:
        raw = (PROC / str(int(pid)) / "stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (comm) S ppid ...": comm may hold spaces and parentheses, the last ")" ends it
    fields = raw.rpartition(b")")[2].split()
    return int(fields[1]), fields[0].decode("ascii")


def mem_available() -> int:
    """The kernel's estimate of the memory available for new work (bytes, ``MemAvailable``)."""
    for line in (PROC / "meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise OSError("no MemAvailable in /proc/meminfo")


def pidfd_dead(pidfd: int, timeout_s: float = 0.0) -> bool:
    """Whether the process of ``pidfd`` has exited (a pidfd is readable once it has), waiting
    up to ``timeout_s``. ``poll``, never ``select``: a daemon that holds thousands of kernels
    holds descriptors above ``select``'s 1024, which it refuses (``ValueError``)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(max(0, math.ceil(timeout_s * 1000))))
