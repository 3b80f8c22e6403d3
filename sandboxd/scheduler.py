"""Admission control: at most N executions at once, a bounded queue that is fair between clients.

* ``max_concurrency`` slots (default 4). A call that finds a free slot and nobody waiting runs
  at once.
* Otherwise it waits in its client's FIFO queue. When a slot frees, clients are served round-robin
  (one call per client in turn), so one chatty client cannot starve the others.
* The queue holds at most ``queue_size`` calls in total, and one client at most
  ``per_client`` of them (default: half the queue); beyond that :class:`QueueFull`. When the
  queue is full, a call of a client that holds fewer places than the biggest holder takes the
  newest place of that holder, which gets :class:`QueueFull` instead: so a client with nothing
  queued always gets a place, however busy the others keep the queue.
* A call waits at most ``queue_timeout_s`` (:class:`QueueTimeout`), and never past its own
  deadline (:class:`DeadlineExpired`): the deadline counts from admission, so queueing cannot
  stretch it.
* Cancelling a waiting task removes it from the queue; a slot handed to a task that is being
  cancelled is passed on to the next waiter, never lost.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from sandboxd.errors import SandboxdError
from sandboxd.util.deadline import within


class Overloaded(SandboxdError):
    """Base of the scheduler's refusals. ``retry_after`` is a hint in whole seconds."""

    code = "overloaded"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def problem_fields(self) -> dict[str, Any]:
        return {"retry_after": self.retry_after}

    def problem_headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class QueueFull(Overloaded):
    """Every slot is busy and the queue is full."""


class QueueTimeout(Overloaded):
    """The call waited ``queue_timeout_s`` without getting a slot."""


class DeadlineExpired(SandboxdError):
    """The call's own deadline passed while it was still queued."""

    code = "deadline-expired"


class Scheduler:
    """Slots and a fair bounded queue; use :meth:`slot` as an async context manager."""

    def __init__(self, max_concurrency: int = 4, queue_size: int = 64,
                 queue_timeout_s: float = 30.0, per_client: int | None = None,
                 what: str = "execution slots") -> None:
        self.max_concurrency = max_concurrency
        self.what = what  # what the slots are, in refusals
        self.queue_size = queue_size
        self.per_client = per_client if per_client is not None else max(1, queue_size // 2)
        self.queue_timeout_s = queue_timeout_s
        self._in_use = 0
        self._waiting = 0
        self._queues: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._avg_run_s = 1.0  # exponentially weighted mean execution time, for Retry-After

    @property
    def in_use(self) -> int:
        """Slots executing now."""
        return self._in_use

    @property
    def queued(self) -> int:
        """Calls waiting for a slot."""
        return self._waiting

    def retry_after(self) -> int:
        """A hint for ``Retry-After``: roughly when a queue place should be free again."""
        waves = (self._waiting + 1) / self.max_concurrency
        return max(1, min(60, math.ceil(self._avg_run_s * waves)))

    @asynccontextmanager
    async def slot(self, client: str, deadline: float) -> AsyncIterator[None]:
        """Hold one execution slot for the body of the ``async with``."""
        await self._acquire(client, deadline)
        started = time.monotonic()
        try:
            yield
        finally:
            self._avg_run_s = 0.8 * self._avg_run_s + 0.2 * (time.monotonic() - started)
            self._release()

    async def _acquire(self, client: str, deadline: float) -> None:
        if self._in_use < self.max_concurrency and self._waiting == 0:
            self._in_use += 1
            return
        mine = len(self._queues.get(client, ()))
        if mine >= self.per_client:
            raise QueueFull(
                f"all {self.max_concurrency} {self.what} are busy and client '{client}' "
                f"already has {mine} calls waiting (at most {self.per_client} per client); "
                "retry later",
                self.retry_after(),
            )
        if self._waiting >= self.queue_size and not self._push_out(mine):
            raise QueueFull(
                f"all {self.max_concurrency} {self.what} are busy and the queue is full "
                f"({self.queue_size} waiting); retry later",
                self.retry_after(),
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExpired("the call's deadline passed before it could run")
        wait = min(self.queue_timeout_s, remaining)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(client, deque()).append(future)
        self._waiting += 1
        try:
            # a slot granted just as we are cancelled is handed on (orphan), never lost; a
            # place given away to another client raises its QueueFull from here
            got, _ = await within(future, wait, orphan=lambda _: self._release())
        except asyncio.CancelledError:
            self._forget(client, future)  # (nothing to forget once it was granted)
            raise
        if not got:
            self._forget(client, future)
            if wait >= remaining:
                raise DeadlineExpired("the call's deadline passed while it waited for a slot")
            raise QueueTimeout(
                f"none of the {self.what} became free within {self.queue_timeout_s:g} s; "
                "retry later",
                self.retry_after(),
            )

    def _push_out(self, mine: int) -> bool:
        """The queue is full: free the newest place of the client holding the most places,
        if it holds more than ``mine`` (that call gets :class:`QueueFull`)."""
        if not self._queues:
            return False
        victim, queue = max(self._queues.items(), key=lambda item: len(item[1]))
        if len(queue) <= mine:
            return False
        future = queue.pop()
        self._waiting -= 1
        if not queue:
            del self._queues[victim]
        future.set_exception(QueueFull(
            f"all {self.max_concurrency} {self.what} are busy and the queue is full; this "
            f"call of client '{victim}' gave its place to another client's (every client is "
            "guaranteed a place); retry later",
            self.retry_after(),
        ))
        return True

    def _forget(self, client: str, future: asyncio.Future[None]) -> None:
        queue = self._queues.get(client)
        if queue is not None and future in queue:
            queue.remove(future)
            self._waiting -= 1
            if not queue:
                del self._queues[client]

    def _release(self) -> None:
        """Give the freed slot to the next client in round-robin order, or free it."""
        while self._queues:
            client, queue = next(iter(self._queues.items()))
            future = queue.popleft()
            self._waiting -= 1
            if queue:
                self._queues.move_to_end(client)  # this client goes to the back of the line
            else:
                del self._queues[client]
            if not future.done():
                future.set_result(None)  # the slot passes directly to the waiter
                return
        self._in_use -= 1


class ClientPools:
    """A small :class:`Scheduler` of its own for each client (made on first use, dropped when
    idle): the slots of raw file transfers, which wait on the network and must never hold
    an execution slot that another client's call needs."""

    def __init__(self, per_client: int, queue_size: int, queue_timeout_s: float,
                 queue_per_client: int | None = None, what: str = "transfer slots") -> None:
        self._make: Callable[[], Scheduler] = lambda: Scheduler(
            per_client, queue_size, queue_timeout_s, queue_per_client,
            what=f"{what} of this client")
        self._pools: dict[str, Scheduler] = {}

    @property
    def in_use(self) -> int:
        """Slots held now, every client together."""
        return sum(pool.in_use for pool in self._pools.values())

    @asynccontextmanager
    async def slot(self, client: str, deadline: float) -> AsyncIterator[None]:
        """Hold one of ``client``'s slots for the body of the ``async with``."""
        pool = self._pools.setdefault(client, self._make())
        try:
            async with pool.slot(client, deadline):
                yield
        finally:
            if pool.in_use == 0 and pool.queued == 0 and self._pools.get(client) is pool:
                del self._pools[client]
