"""Which session kernels died since the last look, for every live kernel in one system call."""

from __future__ import annotations

import contextlib
import select


class Deaths:
    """The live kernels' pidfds in one epoll set: which kernels died since the last look, in
    one system call whatever their number (a poll of each kernel's pidfd made every call
    cost a system call per live kernel, several times a call)."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.sessions: dict[int, str] = {}  # pidfd -> session id

    def watch(self, pidfd: int, sid: str) -> None:
        self.epoll.register(pidfd, select.EPOLLIN)  # readable once the process has exited
        self.sessions[pidfd] = sid

    def forget(self, pidfd: int | None) -> None:
        if pidfd is not None and self.sessions.pop(pidfd, None) is not None:
            with contextlib.suppress(OSError, ValueError):
                self.epoll.unregister(pidfd)

    def died(self) -> list[str]:
        """The sessions whose kernel has exited since the last look (each said once)."""
        if not self.sessions:
            return []
        gone = []
        for fd, _ in self.epoll.poll(0):
            sid = self.sessions.get(fd)
            self.forget(fd)
            if sid is not None:
                gone.append(sid)
        return gone
