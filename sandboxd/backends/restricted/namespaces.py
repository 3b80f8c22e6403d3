"""PID and IPC namespaces of the restricted workers (when the daemon is root).

Every worker is the first process - PID 1 - of its own PID namespace, and has its own IPC
namespace: it cannot name any other process (no pid of another sandbox, of the zygote or of
the daemon means anything inside it), and no SysV segment, semaphore or message queue is shared
with another call or outlives the worker (the namespace dies with its last process).

How: ``unshare(CLONE_NEWPID)`` only changes the namespace of the caller's *future children*,
so the zygote calls it right before forking a worker (:class:`NamespaceForker`) and then
switches its "children's namespace" back to its own with ``setns`` (a second
``unshare(CLONE_NEWPID)`` would otherwise fail); the worker - a direct child of the zygote as
before, so ``wait4``, pidfds, exit reports and cleanup verification are unchanged - unshares
its IPC namespace itself (:func:`enter_ipc_namespace`).

A namespace's PID 1 sees its parent as pid 0, so the worker cannot check ``getppid()`` for a
parent that died before ``PR_SET_PDEATHSIG`` was set: the zygote holds the write end of a
pipe (:class:`Lifeline`) and the read end reports end-of-file once the zygote is gone.

A PID namespace's init ignores signals it has no handler for, except SIGKILL/SIGSTOP and
faults: RLIMIT_CPU's SIGXCPU is ignored, its hard limit (one second later) SIGKILLs the worker
(:mod:`.backend` maps both to ``cpu_limit``).
"""

from __future__ import annotations

import ctypes
import os
import select

from sandboxd.backends.restricted import forking

CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000

_LIBC = ctypes.CDLL(None, use_errno=True)


def _check(res: int, what: str) -> None:
    if res != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    """``unshare(2)`` (Python 3.11 has no ``os.unshare``)."""
    _check(_LIBC.unshare(ctypes.c_int(flags)), "unshare")


def setns(fd: int, nstype: int) -> None:
    """``setns(2)``."""
    _check(_LIBC.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


def unavailable() -> str | None:
    """Why new PID and IPC namespaces cannot be created here (None: they can).

    Tried in a short-lived child, since the answer depends on what this process inherited:
    the hardened unit's ``RestrictNamespaces=yes`` and its capability set without
    ``CAP_SYS_ADMIN`` forbid them; the sandboxes are then separated by their uids and the
    seccomp filter alone (docs/operations.md, "PID and IPC namespaces")."""
    import subprocess
    import sys

    code = ("import ctypes, os, sys\n"
            f"r = ctypes.CDLL(None, use_errno=True).unshare({CLONE_NEWPID | CLONE_NEWIPC})\n"
            "sys.exit(0 if r == 0 else ctypes.get_errno())")
    try:
        res = subprocess.run([sys.executable, "-S", "-c", code], timeout=30, check=False,
                             stdin=subprocess.DEVNULL, capture_output=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot test unshare(): {exc}"
    if res.returncode == 0:
        return None
    if res.returncode > 0:
        return (f"unshare(CLONE_NEWPID|CLONE_NEWIPC) is refused here "
                f"({os.strerror(res.returncode)}; e.g. RestrictNamespaces=, no CAP_SYS_ADMIN)")
    return f"cannot test unshare(): exit {res.returncode}"


class NamespaceForker:
    """In the zygote: ``fork()`` whose child is PID 1 of a new PID namespace."""

    def __init__(self) -> None:
        self._own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        # prove it works once, at start-up: a zygote that cannot isolate its workers must
        # fail to start rather than hand out unisolated ones
        unshare(CLONE_NEWPID)
        setns(self._own, CLONE_NEWPID)

    def fork(self) -> int:
        """Like :func:`.forking.fork`; in the child ``os.getpid() == 1``."""
        unshare(CLONE_NEWPID)
        try:
            return forking.fork()
        finally:
            if os.getpid() != 1:  # the zygote: later children go back to its own namespace
                setns(self._own, CLONE_NEWPID)

    @property
    def fd(self) -> int:
        return self._own


def enter_ipc_namespace() -> None:
    """In the worker (still root): a private, empty SysV/POSIX-mq IPC namespace."""
    unshare(CLONE_NEWIPC)


class Lifeline:
    """A pipe whose write end only the zygote keeps: the read end (kept by every worker)
    shows end-of-file once the zygote is gone."""

    def __init__(self) -> None:
        # a worker keeps only the read end (its descriptor clean-up closes the write end)
        self.read_fd, self.write_fd = os.pipe()


def parent_gone(read_fd: int) -> bool:
    """True when every write end of the lifeline is closed (the zygote died)."""
    ready, _, _ = select.select([read_fd], [], [], 0)
    return bool(ready)
