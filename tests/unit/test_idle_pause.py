"""Idle session containers are paused (no CPU while idle): the pause/thaw logic of
:mod:`sandboxd.backends.container.idle` against a fake engine: never a pause while a call is
counted, a thaw waits for a pause in flight, and engine failures give truthful states."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from sandboxd.backends.container import engine
from sandboxd.backends.container.boxes import Box
from sandboxd.backends.container.dockerapi import APIError, NoAnswer
from sandboxd.backends.container.idle import Idle, ThawFailed

KEY = ("client", "s1", "image")


class FakeBoxes:
    """What :class:`Idle` uses of :class:`~sandboxd.backends.container.boxes.Boxes`."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: dict[str, Exception] = {}
        self.closing = False
        self.available = (True, None)
        self.client = object()
        self.failed: list[BaseException] = []

    async def engine(self, fn: Callable[..., Any], *args: Any) -> None:
        name = {engine.pause: "pause", engine.unpause: "unpause"}[fn]
        if name == "pause":
            await self.gate.wait()
        if name in self.fail:
            raise self.fail[name]
        self.calls.append(name)

    def engine_failed(self, exc: BaseException) -> None:
        self.failed.append(exc)


def _setup() -> tuple[FakeBoxes, Idle, Box, dict[tuple[str, str, str], Box]]:
    boxes = FakeBoxes()
    idle = Idle(boxes, 0.0)  # type: ignore[arg-type]
    box = Box(name="b", image="image", shape=None, endpoint=None, role="session",  # type: ignore[arg-type]
              cid="c1")
    return boxes, idle, box, {KEY: box}


async def test_no_pause_while_a_call_is_counted() -> None:
    boxes, idle, box, by_key = _setup()
    with idle.using(KEY):
        assert await idle.pause_idle(by_key) == []
    assert await idle.pause_idle(by_key) == [KEY]
    assert box.paused and boxes.calls == ["pause"]
    assert await idle.pause_idle(by_key) == []  # paused already


async def test_a_call_during_a_pause_in_flight_waits_then_thaws() -> None:
    boxes, idle, box, by_key = _setup()
    boxes.gate.clear()
    pausing = asyncio.create_task(idle.pause_idle(by_key))
    while not box.freeze.locked():
        await asyncio.sleep(0)
    with idle.using(KEY):  # the call starts now
        thaw = asyncio.create_task(idle.thaw(KEY, box))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not thaw.done()  # it waits for the pause
        boxes.gate.set()
        await thaw
        assert not box.paused
    assert await pausing == [KEY]
    assert boxes.calls == ["pause", "unpause"]


async def test_a_thaw_the_engine_refuses_raises() -> None:
    boxes, idle, box, by_key = _setup()
    await idle.pause_idle(by_key)
    boxes.fail["unpause"] = APIError(409, "no", "POST /containers/c1/unpause")
    with pytest.raises(ThawFailed, match="could not be resumed: no"):
        await idle.thaw(KEY, box)
    assert box.paused  # as the engine left it; the session drops the container


async def test_a_failed_pause_is_truthful() -> None:
    boxes, idle, box, by_key = _setup()
    # the engine answered: not paused
    boxes.fail["pause"] = APIError(409, "refused", "POST /containers/c1/pause")
    assert await idle.pause_idle(by_key) == [] and not box.paused
    # no answer: it may be paused, so the next call thaws it (harmless if it was not)
    boxes.fail["pause"] = NoAnswer("gone")
    assert await idle.pause_idle(by_key) == [] and box.paused and boxes.failed
    await idle.thaw(KEY, box)
    assert not box.paused and boxes.calls == ["unpause"]


async def test_a_dead_box_is_neither_paused_nor_thawed() -> None:
    boxes, idle, box, by_key = _setup()
    box.dead = True
    assert await idle.pause_idle(by_key) == []
    box.paused = True
    await idle.thaw(KEY, box)
    assert boxes.calls == []
