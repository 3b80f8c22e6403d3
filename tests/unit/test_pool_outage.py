"""The warm pool across an engine outage: a container whose start was under way when the
engine went away is dead (the engine stopped it), never queued as an idle container. Found by
CI's fresh-clone run (tests/faults/test_docker.py::test_engine_goes_away_and_comes_back, flaky
2 in 9 here): such a container stayed in the pool and among the live ones, so the reconnect
kept it, exited, until a call took it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from sandboxd.backends.container.pool import WarmPool
from tests.support.wait import async_wait_until


class _Box:
    """A stand-in container (hashable, as the real Box is)."""

    def __init__(self, name: str) -> None:
        self.name, self.cid, self.dead = name, "c", False


class _Boxes:
    """Just what the pool uses of the container boxes; ``new`` waits for ``release``."""

    closing = False
    available = (True, None)

    def __init__(self) -> None:
        self.stale: set[Any] = set()
        self.config = SimpleNamespace(warm_pool_size=1)
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.made: list[Any] = []

    async def new(self, **_: Any) -> Any:
        self.started.set()
        await self.release.wait()
        box = _Box(f"pool-{len(self.made)}")
        self.made.append(box)
        return box

    async def destroy(self, box: Any) -> bool:
        return True


async def test_a_container_started_across_an_outage_is_dead_not_pooled() -> None:
    boxes = _Boxes()
    pool = WarmPool(boxes)  # type: ignore[arg-type]
    pool.start({"img"})
    try:
        await asyncio.wait_for(boxes.started.wait(), 10)
        pool.lost()  # the engine goes away while the container starts
        boxes.release.set()  # ... and its start returns afterwards
        await async_wait_until(lambda: pool._filling.get("img") == 0, timeout=10,
                               what="the start to end")
        (box,) = boxes.made
        assert box.dead and box in boxes.stale
        assert list(pool.queues["img"]) == []
    finally:
        await pool.stop()


async def test_a_container_started_before_any_outage_is_pooled() -> None:
    boxes = _Boxes()
    pool = WarmPool(boxes)  # type: ignore[arg-type]
    pool.start({"img"})
    try:
        boxes.release.set()
        await async_wait_until(lambda: len(pool.queues["img"]) == 1, timeout=10,
                               what="the pool filled")
        assert not boxes.made[0].dead and not boxes.stale
    finally:
        await pool.stop()
