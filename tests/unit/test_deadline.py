"""The one deadline idiom (sandboxd.util.deadline): ``within`` never loses a result or a
cancellation, and ``stop_task`` waits until a task has stopped without swallowing our own cancel."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandboxd.util.deadline import stop_task, within
from tests.support.wait import async_wait_until


async def _value_after(delay: float, value: Any) -> Any:
    await asyncio.sleep(delay)  # sleep-ok: a test double's work that takes ``delay`` seconds
    return value


def test_within_returns_the_result_or_stops_the_work() -> None:
    async def scenario() -> tuple[Any, Any, bool]:
        fast = await within(_value_after(0, "v"), 1)
        slow_task = asyncio.ensure_future(_value_after(10, "late"))
        slow = await within(slow_task, 0.05)
        return fast, slow, slow_task.cancelled()

    assert asyncio.run(scenario()) == ((True, "v"), (False, None), True)


def test_within_hands_a_result_that_beat_the_cancel_to_orphan() -> None:
    """The work finishes in the same loop step as the cancel: wait_for on 3.11 would return
    the value and swallow the cancel; within cancels and gives the value to ``orphan``."""
    async def scenario() -> tuple[list[Any], bool]:
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        orphans: list[Any] = []
        waiter = asyncio.create_task(within(done, 5, orphan=orphans.append))
        await asyncio.sleep(0)
        done.set_result("granted")
        waiter.cancel()
        try:
            await waiter
        except asyncio.CancelledError:
            return orphans, True
        return orphans, False

    assert asyncio.run(scenario()) == (["granted"], True)


def test_within_raises_the_work_s_own_error() -> None:
    async def boom() -> None:
        raise ValueError("inner")

    with pytest.raises(ValueError, match="inner"):
        asyncio.run(within(boom(), 1))


def test_stop_task_waits_for_the_task_and_drops_its_error() -> None:
    async def scenario() -> list[str]:
        seen: list[str] = []

        async def stubborn() -> None:
            try:
                await asyncio.sleep(10)  # sleep-ok: work that runs until it is cancelled
            finally:
                await asyncio.sleep(0.05)  # sleep-ok: a test double's cleanup takes a while
                seen.append("cleaned")
                raise RuntimeError("while stopping")

        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0)
        await stop_task(task)
        await stop_task(None)
        seen.append("stopped")
        return seen

    assert asyncio.run(scenario()) == ["cleaned", "stopped"]


def test_stop_task_does_not_swallow_our_own_cancellation() -> None:
    async def scenario() -> tuple[bool, bool]:
        cleaning = asyncio.Event()

        async def slow_to_stop() -> None:
            try:
                await asyncio.sleep(10)  # sleep-ok: work that runs until it is cancelled
            finally:
                cleaning.set()
                await asyncio.sleep(0.1)  # sleep-ok: a test double's cleanup takes a while

        inner = asyncio.create_task(slow_to_stop())
        await asyncio.sleep(0)
        outer = asyncio.create_task(stop_task(inner))
        await async_wait_until(cleaning.is_set, timeout=5,
                               what="stop_task to cancel the task and wait for its cleanup")
        outer.cancel()
        try:
            await outer
        except asyncio.CancelledError:
            return True, inner.done()
        return False, inner.done()

    assert asyncio.run(scenario()) == (True, True)
