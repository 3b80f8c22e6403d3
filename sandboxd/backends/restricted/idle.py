"""Proof from outside that a session kernel is idle (its own word cannot be trusted).

A kernel's report says its call is over, but the report is written by the process that ran
user code: code that escaped the language layer can write one and run on. So the daemon ends
a kernel's call only once it has seen, in ``/proc`` and never from the kernel's own words,
that the process is parked where the trusted loop waits for the next request:

* blocked in ``read(2)`` on its request socket (``/proc/PID/syscall``: the syscall number and
  the descriptor the zygote gave it);
* with every signal it catches blocked (``/proc/PID/status``: ``SigBlk`` covers ``SigCgt``),
  so that no timer or handler can wake it - the loop blocks them all before it reads; and
* alone (``Threads: 1``; seccomp denies ``clone`` anyway).

Such a process runs nothing until the daemon writes its next request (or kills it). The trusted
loop takes a few microseconds from its report to the ``read``; :func:`prove_idle` polls until
then, within the call's own deadline: code that keeps running after a (forged) report is never
proven idle, and its call ends on the deadline with the kernel lost.

Reading ``/proc/PID/syscall`` takes ptrace access. A daemon with ``CAP_SYS_PTRACE`` has it; the
systemd unit grants no such capability, so :func:`read_proc` reads, when refused, as the
sandbox's own uid (``setfsuid``/``setfsgid`` on this thread for the one ``open``): the kernel
is dumpable (:func:`~.contain.drop_privileges`) and a descendant of the daemon.
"""

from __future__ import annotations

import asyncio
import os
import platform
import time

from sandboxd.backends.restricted.contain import libc

#: ``read(2)``'s number on the machines sandboxd runs on (``/proc/PID/syscall`` shows numbers)
READ_SYSCALL = {"x86_64": 0, "aarch64": 63}.get(platform.machine(), -1)
#: how long :func:`prove_idle` looks again at once (yielding the CPU in between: the kernel
#: is a few microseconds from its ``read`` when its report arrives), then how long it sleeps
#: between looks, at first and at most (uvloop's timers have a resolution of 1 ms)
SPIN_S, FIRST_SLEEP_S, LAST_SLEEP_S = 0.0005, 0.001, 0.02
#: what :func:`not_idle_because` says of a process that has ended (no use waiting longer)
GONE = "it has ended"


def _read(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # no file object: this runs every call
    try:
        return os.read(fd, 4096).decode("ascii", "replace")
    finally:
        os.close(fd)


def read_proc(pid: int, name: str, uid: int | None) -> str:
    """``/proc/PID/name``; when that is refused and the daemon is root, read again as the
    sandbox's uid and gid (this thread's filesystem identity only, for the one ``open``)."""
    path = f"/proc/{pid}/{name}"
    try:
        return _read(path)
    except (PermissionError, FileNotFoundError):
        if uid is None or os.geteuid() != 0:
            raise
    c = libc()
    c.setfsgid(uid)
    c.setfsuid(uid)
    try:
        return _read(path)
    finally:
        c.setfsuid(0)
        c.setfsgid(0)


def _field(status: str, name: str) -> str:
    """The value of ``name:`` in ``/proc/PID/status`` text ("" when it has none)."""
    start = status.find(f"\n{name}:")
    if start < 0:
        return ""
    start += len(name) + 2
    end = status.find("\n", start)
    return status[start:end if end >= 0 else None].strip()


def not_idle_because(pid: int, fd: int, uid: int | None) -> str | None:
    """``None`` when process ``pid`` is parked reading descriptor ``fd`` with every signal it
    catches blocked and no other thread, else what it is doing instead."""
    try:
        syscall = read_proc(pid, "syscall", uid).split()
        status = read_proc(pid, "status", uid)
    except FileNotFoundError:
        return GONE
    except OSError as exc:
        return f"its state could not be read ({type(exc).__name__})"
    if "\nState:\tZ" in status:
        return GONE
    if not syscall or syscall[0] == "running":
        return "it is running"
    if syscall[0] != str(READ_SYSCALL) or len(syscall) < 2 or syscall[1] != hex(fd):
        return f"it is in system call {syscall[0]}, not waiting for its next request"
    if _field(status, "Threads") != "1":
        return "it runs more than one thread"
    try:
        blocked, caught = int(_field(status, "SigBlk"), 16), int(_field(status, "SigCgt"), 16)
    except ValueError:
        return "its signal masks could not be read"
    if caught & ~blocked:
        return "a signal it catches could still wake it"
    return None


async def prove_idle(pid: int, fd: int, uid: int | None, deadline: float) -> str | None:
    """Wait until :func:`not_idle_because` finds the kernel idle (``None``), or the monotonic
    ``deadline`` passes (then: why it was not idle at the last look)."""
    spin_until = time.monotonic() + SPIN_S
    pause = FIRST_SLEEP_S
    while True:
        why = not_idle_because(pid, fd, uid)
        if why is None:
            return None
        now = time.monotonic()
        if now >= deadline or why is GONE:
            return why
        if now < spin_until:
            os.sched_yield()  # on a busy host the kernel may wait for this very CPU
            await asyncio.sleep(0)
            continue
        await asyncio.sleep(min(pause, deadline - now))
        pause = min(pause * 2, LAST_SLEEP_S)
