"""Process containment of a worker: ``prctl`` (no_new_privs, parent-death signal), descriptors,
chroot, the drop to the sandbox identity, the tie to the zygote's life and rlimits. Each step
is one function; :func:`sandboxd.backends.restricted.confine.enter_sandbox` calls them in order.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
from collections.abc import Mapping
from typing import Any

from sandboxd.backends.restricted.cgroups import read_small
from sandboxd.protocol.limits import RLIMIT_NAMES

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_GET_SECCOMP = 21
PR_SET_NO_NEW_PRIVS = 38

_LIBC: Any = None


def libc() -> Any:
    """This process's libc (loaded once, with ``errno`` kept for :func:`ctypes.get_errno`)."""
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def prctl(option: int, arg2: int = 0) -> int:
    """``prctl(2)`` through libc."""
    res = libc().prctl(
        ctypes.c_int(option),
        ctypes.c_ulong(arg2),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )
    if res < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(res)


def close_fds(keep: list[int]) -> None:
    """stdin/stdout/stderr to /dev/null; every other descriptor but ``keep`` closed."""
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    lo = 3
    for fd in sorted(set(keep)):
        if fd >= lo:
            os.closerange(lo, fd)
            lo = fd + 1
    os.closerange(lo, 1 << 20)


def vm_size() -> int:
    """Virtual memory size of this process (the address-space baseline for RLIMIT_AS)."""
    try:
        return int(read_small("/proc/self/statm").split()[0]) * resource.getpagesize()
    except (OSError, ValueError):
        return 256 * 1024 * 1024


def enter_workspace(workspace: str, chroot: bool) -> str:
    """``chroot`` into the workspace (root) or ``chdir`` into it; returns the workspace's path
    as this process now names it."""
    if chroot:
        os.chroot(workspace)
        os.chdir("/")
        return "/"
    os.chdir(workspace)
    return workspace


def drop_privileges(uid: int, gid: int) -> None:
    """No supplementary groups, then gid and uid (real, effective, saved) of the sandbox; then
    dumpable again (the uid change cleared it), so that the daemon, reading as this uid, can
    see in ``/proc`` that a session kernel is idle (:mod:`.idle`). Nothing else gains by it:
    no core files (RLIMIT_CORE 0), no ``ptrace`` (seccomp), no ``/proc`` in the chroot."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        raise PermissionError("could not drop root privileges")
    prctl(PR_SET_DUMPABLE, 1)


def tie_to_zygote(zygote_pid: int, lifeline_fd: int | None) -> None:
    """Die with the zygote (``PR_SET_PDEATHSIG``, cleared by a uid change, so set after it),
    and refuse to go on if it is already gone: through the lifeline when the worker is PID 1
    of its namespace (see :mod:`.namespaces`), else by ``getppid()``."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if lifeline_fd is not None:
        from sandboxd.backends.restricted.namespaces import parent_gone

        if parent_gone(lifeline_fd):
            raise RuntimeError("zygote is gone")
        os.close(lifeline_fd)
    elif os.getppid() != zygote_pid:
        raise RuntimeError("zygote is gone")


def set_rlimits(
    cpu_seconds: int, baseline_vm: int, memory_bytes: int, pids: int, max_file_bytes: int,
    rlimits: Mapping[str, int], cpu_hard: int | None = None,
) -> None:
    """CPU seconds, address space, processes, file size; no core dumps; over-size writes
    fail with EFBIG instead of SIGXFSZ; then the call's ``rlimits`` (open files, ...)
    (:meth:`sandboxd.protocol.limits.Limits.rlimits`: soft = hard). ``cpu_hard``: the CPU
    hard limit (default one second above the soft one; a session kernel of a non-root daemon
    keeps it unlimited so that the daemon can move the soft limit for every call, see
    :mod:`.kernel`)."""
    cpu = max(1, cpu_seconds)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1 if cpu_hard is None else cpu_hard))
    resource.setrlimit(resource.RLIMIT_AS, (baseline_vm + memory_bytes,) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (pids, pids))
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for name, value in rlimits.items():
        if name not in RLIMIT_NAMES:
            raise ValueError(f"{name} is not a limit a sandbox applies")
        resource.setrlimit(getattr(resource, name), (value, value))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
