"""Proving a one-shot container's processes gone from outside, without waiting for the engine.

The engine starts each container in a PID namespace of its own whose first process is the
container's init. The kernel kills every other process of a namespace when its init dies, and
the init's exit completes only once every one of them is gone (``zap_pid_ns_processes``): a
pidfd of the init that turns readable after ``SIGKILL`` is the kernel's word that nothing of
the container runs any more. A one-shot call's result can then be given at once; the engine
removes the stopped container afterwards (:meth:`Boxes.end`).

The engine reports the init's pid in *its* PID namespace. The pidfd is taken only when the
process behind that number here is the container's own (its cgroup names the container's
id): a daemon in a container of its own (another PID namespace) sees another process or none
under that number and falls back to the engine's removal, as does any error here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from dataclasses import dataclass

from sandboxd.host.procinfo import pidfd_dead
from sandboxd.util.deadline import within

log = logging.getLogger(__name__)


@dataclass
class InitHandle:
    """A pidfd of a container's init, checked to be that container's."""

    pid: int
    fd: int

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def open_init(pid: int, cid: str) -> InitHandle | None:
    """A handle on container ``cid``'s init (engine pid ``pid``), or None when this process
    cannot see it as that container's (another PID namespace, gone, no pidfd support)."""
    if pid <= 0 or len(cid) < 12:
        return None
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
    try:
        # the pidfd pins the process: read its cgroup now, then check it had not exited
        # before the read (a pid reused in between would show another process's cgroup)
        with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as f:
            cgroups = f.read(65536)
        alive = not pidfd_dead(fd)
        if alive and cid in cgroups:
            return InitHandle(pid, fd)
    except OSError:
        pass
    os.close(fd)
    return None


async def kill_and_prove(handle: InitHandle, timeout_s: float) -> bool:
    """``SIGKILL`` the init through its pidfd and wait until the kernel says it (and so every
    process of its namespace) is gone; False when that took longer than ``timeout_s``."""
    try:
        signal.pidfd_send_signal(handle.fd, signal.SIGKILL)
    except ProcessLookupError:
        pass  # exited already: the pidfd is (or turns) readable
    except OSError as exc:
        log.warning("pidfd kill of container init %d: %s", handle.pid, exc)
        return False
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[bool] = loop.create_future()

    def readable() -> None:
        if not ended.done():
            ended.set_result(True)

    loop.add_reader(handle.fd, readable)
    try:
        done, _ = await within(ended, timeout_s)
        return done
    finally:
        loop.remove_reader(handle.fd)
