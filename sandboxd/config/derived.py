"""The caps an admin did not set, derived from the memory this host has.

``max_kernels`` (0: derived) is as many idle kernels as fit in the host's memory above the
reserve, at ``kernel_memory_bytes`` each; the sandbox uid range (``sandbox_uid_count`` 0:
derived) holds a uid for each of them plus the one-shot calls and warm containers, never fewer
than the 900 uids of a fixed range. Derived once, from the memory the host *has* (stable
across restarts); what it has *free* is measured at every admission
(:mod:`sandboxd.capacity.admission`).
"""

from __future__ import annotations

from sandboxd.util.memory import MemoryReading

MIB = 1024 * 1024
#: the memory the host keeps for itself at least (the daemon, the zygote, the system)
MIN_RESERVE_BYTES = 512 * MIB
#: ... or this share of it, if that is more
RESERVE_SHARE = 0.05
#: the size of a fixed uid range (sandboxd's before caps were derived): never fewer
MIN_UID_COUNT = 900
#: uids above every derived kernel: one-shot calls, warm containers, sessions without a kernel
UID_MARGIN = 256
#: uids of a range at most (a derived range stays well inside the 32-bit uid space and below
#: the ranges of systemd's dynamic users, 61184 and up, from 10100)
MAX_UID_COUNT = 50000


def reserve_bytes(setting: int, memory: MemoryReading) -> int:
    """The headroom kept free (``memory_reserve_bytes``; 0: the larger of 512 MiB and 5 %)."""
    if setting:
        return setting
    return max(MIN_RESERVE_BYTES, int(memory.total * RESERVE_SHARE))


def max_kernels(memory: MemoryReading, reserve: int, kernel_bytes: int) -> int:
    """The live kernels the host's memory holds above the reserve (at least one)."""
    return max(1, (memory.total - reserve) // kernel_bytes)


def uid_count(kernels: int, need: int) -> int:
    """A sandbox uid range that fits ``kernels`` sessions with a kernel each, and a margin for
    one-shot calls and warm containers (``need``, what they take at most, if that is more):
    the same range whatever the scheduler's settings, unless they need more."""
    return max(MIN_UID_COUNT, need, min(MAX_UID_COUNT, kernels + UID_MARGIN))
