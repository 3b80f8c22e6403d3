"""The audit writer thread (an executor's machinery per record was a large share of a call's
CPU in the daemon): the service's records are written by one thread fed by
a :class:`queue.SimpleQueue`, one hand-off each way per record (the answer comes back with
``loop.call_soon_threadsafe``), instead of an executor's machinery per record.

Group commit: every record waiting when the thread wakes is appended in queue order, then one
``fdatasync`` makes the batch durable, and only then is any writer of a durable record told
that its record is written. A record that need not be durable yet (an allowed decision that
its call's result commits: :meth:`AuditLog.decision`) is answered as soon as it is appended:
it is in the file before the code runs. A failed append or sync is the answer of the records
it concerns (an :class:`AuditError`): the caller decides what to tell its client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from sandboxd.audit.writer import AuditError, AuditLog

log = logging.getLogger("sandboxd.audit")

#: one queued write: the function, its keyword arguments, and where its answer goes
_Item = tuple[Callable[..., Any], dict[str, Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


def _settle(item: _Item, value: Any = None, exc: BaseException | None = None) -> None:
    """Hand ``value`` (or ``exc``) to the item's future, on its loop's thread."""
    future = item[3]

    def done() -> None:
        if future.done():  # its waiter was cancelled: the record is written all the same
            return
        if exc is None:
            future.set_result(value)
        else:
            future.set_exception(exc)

    with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for the answer
        item[2].call_soon_threadsafe(done)


class AuditThread:
    """One writer thread for an :class:`AuditLog` (started at the first write)."""

    def __init__(self, audit: AuditLog) -> None:
        self.audit = audit
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def queued(self) -> int:
        """Writes waiting for the thread (not counting the batch it works on)."""
        return self._queue.qsize()

    async def run(self, write: Callable[..., Any], /, **fields: Any) -> Any:
        """``write(**fields)`` on the writer thread (an :class:`AuditLog` method); returns once
        what it wrote is durable (or appended, for a record written not durable)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self._thread is None:
            self._start()
        self._queue.put((write, fields, loop, future))
        return await future

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="audit-writer",
                                                daemon=True)
                self._thread.start()

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, then stop the thread (idempotent)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout)

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, stop = self._batch(first)
            try:
                self._write(batch)
            except BaseException as exc:  # a bug: no waiter may hang on it
                log.exception("the audit writer thread failed")
                for item in batch:
                    _settle(item, exc=AuditError(f"the audit writer failed: {exc}"))
            if stop:
                return

    def _batch(self, first: _Item) -> tuple[list[_Item], bool]:
        """``first`` and everything queued meanwhile, and whether the stop mark came too."""
        batch = [first]
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, False
            if item is None:
                return batch, True
            batch.append(item)

    def _write(self, batch: list[_Item]) -> None:
        """Append the batch's records, sync once, then answer (see the module docstring)."""
        waiting: list[tuple[_Item, Any]] = []
        with self.audit.held_commits() as tickets:
            for item in batch:
                before = len(tickets)
                try:
                    value = item[0](**item[1])
                except Exception as exc:
                    _settle(item, exc=exc)
                    continue
                if len(tickets) > before:
                    waiting.append((item, value))
                else:  # nothing durable to wait for (e.g. a decision its result commits)
                    _settle(item, value)
        if tickets:
            self._commit(max(tickets), waiting)

    def _commit(self, ticket: int, waiting: list[tuple[_Item, Any]]) -> None:
        """Make every record up to ``ticket`` durable with one sync, then answer the writers
        waiting for it (each gets the sync's failure, if it fails)."""
        try:
            self.audit.commit(ticket)
        except Exception as exc:
            for item, _ in waiting:
                _settle(item, exc=exc)
            return
        for item, value in waiting:
            _settle(item, value)
