"""Wait for an event, the one way every test waits (a fixed
sleep is flaky on a slow host and slow on a fast one).

A test waits for what it needs (a process's own state, a record, a file), never for a fixed
time: ``timeout`` only catches a hang, so give it generously. This module is the only place
in ``tests/`` that sleeps to poll (``tests/unit/test_test_waits.py`` checks that).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def _timed_out(what: str, timeout: float, last: object, error: BaseException | None,
               detail: Callable[[], object] | None) -> str:
    message = f"timed out after {timeout} s waiting for {what}"
    message += f" (last error: {error!r})" if error is not None else f" (last value: {last!r})"
    if detail is not None:
        message += f": {detail()}"
    return message


def wait_until(predicate: Callable[[], T], *, timeout: float, interval: float = 0.05,
               what: str, ignore: tuple[type[Exception], ...] = (),
               detail: Callable[[], object] | None = None) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy and
    return that; raise ``AssertionError`` after ``timeout`` seconds, with ``detail()`` (what
    is left, say) in its message. An exception of a type in ``ignore`` counts as "not yet";
    any other propagates at once (so ``assert`` in a predicate fails fast, e.g. when the
    daemon died)."""
    deadline = time.monotonic() + timeout
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            value = predicate()
        except ignore as exc:
            error = exc
        else:
            if value:
                return value
            last, error = value, None
        if time.monotonic() > deadline:
            raise AssertionError(_timed_out(what, timeout, last, error, detail))
        time.sleep(interval)


async def async_wait_until(predicate: Callable[[], T | Awaitable[T]], *, timeout: float,
                           interval: float = 0.05, what: str,
                           ignore: tuple[type[Exception], ...] = (),
                           detail: Callable[[], object] | None = None) -> T:
    """:func:`wait_until` for asyncio tests: ``predicate`` may be a plain or an async
    function; the loop runs between calls."""
    deadline = time.monotonic() + timeout
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
        except ignore as exc:
            error = exc
        else:
            if value:
                return value  # type: ignore[return-value]
            last, error = value, None
        if time.monotonic() > deadline:
            raise AssertionError(_timed_out(what, timeout, last, error, detail))
        await asyncio.sleep(interval)
