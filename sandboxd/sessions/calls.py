"""The calls of each session, as its end sees them: "ended" is a state every step checks.

A session ends (DELETE, TTL expiry, its client revoked) in one order: unregistered first (no
new call finds it), then :meth:`SessionCalls.end` cancels its calls that wait (for a slot, for
its kernel) or run, and waits until every call of it is over; only then do its sandboxes,
workspace and uid go. A call that was between two steps when its session ended is not
cancelled at a random point (its audit records stay whole): it finds the session ended at
its next check (:meth:`~sandboxd.sessions.manager.SessionManager.check_live`) and ends ``cancelled``
without running. So no call outlives its session, and a uid is never handed to a new sandbox
while a call of the old one can still start a process as it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any


class SessionCalls:
    """Per session: how many calls are in flight, which of them its end may cancel now."""

    def __init__(self) -> None:
        self._running: Counter[str] = Counter()  # session id -> its calls in flight
        #: session id -> the tasks of its calls that its end may cancel now
        self._cancellable: dict[str, set[asyncio.Task[Any]]] = {}
        #: task -> how many cancels the end of its session sent it (see :meth:`ended_call`)
        self._cancels: Counter[asyncio.Task[Any]] = Counter()
        self._quiet: dict[str, asyncio.Event] = {}  # session id -> set when none is in flight

    def running(self, session_id: str) -> bool:
        """A call of the session is in flight."""
        return session_id in self._running

    @contextlib.contextmanager
    def counted(self, session_id: str) -> Iterator[list[bool]]:
        """One call of the session in flight; the list yielded holds, after the block, whether
        it was the last one."""
        last = [False]
        self._running[session_id] += 1
        try:
            yield last
        finally:
            self._running[session_id] -= 1
            if self._running[session_id] <= 0:
                del self._running[session_id]
                last[0] = True
                quiet = self._quiet.pop(session_id, None)
                if quiet is not None:
                    quiet.set()

    @contextlib.contextmanager
    def cancellable(self, session_id: str) -> Iterator[None]:
        """The current task's part that the session's end cancels (its waits and its run)."""
        task = asyncio.current_task()
        if task is None:
            yield
            return
        tasks = self._cancellable.setdefault(session_id, set())
        tasks.add(task)
        try:
            yield
        finally:
            tasks.discard(task)
            if not tasks and self._cancellable.get(session_id) is tasks:
                del self._cancellable[session_id]

    async def end(self, session_id: str) -> int:
        """The session has ended: cancel its calls that wait or run (their backends end and
        verify what they started) and wait until every call of it is over, however it ends.
        Returns how many were cancelled."""
        cancelled = 0
        for task in self._cancellable.pop(session_id, set()):
            # one being cancelled already (its caller went away) is ending: a second cancel
            # could cut the cleanup it is carrying out, so it is only waited for
            if not task.done() and not task.cancelling():
                self._cancels[task] += 1
                task.cancel()
                cancelled += 1
        while session_id in self._running:
            await self._quiet.setdefault(session_id, asyncio.Event()).wait()
        return cancelled

    def ended_call(self, task: asyncio.Task[Any] | None) -> int:
        """How many cancels the end of its session sent ``task`` (forgotten here): the
        service takes them back (``uncancel``) and answers the call ``cancelled``."""
        return self._cancels.pop(task, 0) if task is not None else 0
