"""The one way the daemon (and the client's agent loop) waits for something with a time
limit: :func:`within`.

Every backend uses it instead of ``asyncio.wait_for`` / ``asyncio.timeout``: on Python 3.11
``wait_for`` can swallow a cancellation that arrives just as the awaited thing finishes (the
call's task then runs on as if nobody had cancelled it, and the cleanup that cancellation
should start never happens), and it can drop a result that arrived while it was being
cancelled. :func:`within` never loses either, and it always waits until what it cancelled has
really stopped. :func:`stop_task` is its companion for a task that runs until it is told to end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def within(aw: Awaitable[T], timeout: float,
                 orphan: Callable[[T], None] | None = None) -> tuple[bool, T]:
    """``(True, result)`` when ``aw`` finishes within ``timeout`` seconds (its exception is
    raised as it is), else cancel it, wait until it has really stopped, and return
    ``(False, None)``.

    When we are cancelled meanwhile, ``aw`` is cancelled and waited for, and the cancellation
    goes on: as the inner work's own ``CancelledError`` subclass when it raised one (e.g.
    :class:`~sandboxd.backends.base.CancelledAfterCleanup`, which carries the cleanup proof),
    and a result that arrived all the same is handed to ``orphan``.
    """
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(timeout, 0))
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.wait({task})
        if task.cancelled():
            try:
                task.result()
            except asyncio.CancelledError as inner:
                if type(inner) is not asyncio.CancelledError:  # the inner work's own proof
                    raise
        elif orphan is not None and task.exception() is None:
            orphan(task.result())
        raise
    if not done:
        task.cancel()
        await asyncio.wait({task})
        if task.cancelled():
            return False, None  # type: ignore[return-value]
    return True, task.result()


async def stop_task(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` and wait until it has really stopped, whatever it ends with (its
    exception is retrieved and dropped). Unlike ``suppress(BaseException): await task``, our
    own cancellation is never swallowed: it goes on once the task has stopped."""
    if task is None:
        return
    task.cancel()
    try:
        await asyncio.wait({task})
    except asyncio.CancelledError:
        await asyncio.wait({task})
        raise
    finally:
        if task.done() and not task.cancelled():
            task.exception()
