"""The warm pool: containers created and started ahead of time, one queue per image, each
with its runner connected and a private ``/workspace`` tmpfs. A one-shot call takes one; the
pool refills in the background, sized by the setting and by the host's free memory."""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from sandboxd.backends.container import engine
from sandboxd.backends.container.boxes import Box, Boxes, runner_lost
from sandboxd.host import procinfo
from sandboxd.models import Limits
from sandboxd.util.deadline import stop_task

log = logging.getLogger("sandboxd.container")

#: idle containers (the warm pool's, ready sessions') may reserve at most this share of
#: the host's free memory, each kind
POOL_MEMORY_SHARE = 0.25
POOL_PARALLEL_STARTS = 2


class WarmPool:
    """The idle containers of each image, and the task that keeps their number up."""

    def __init__(self, boxes: Boxes) -> None:
        self.boxes = boxes
        self.queues: dict[str, deque[Box]] = {}
        self.shapes: dict[str, engine.Shape] = {}
        self._filling: dict[str, int] = {}
        self.refill = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: container starts under way (each one's own task): :meth:`stop` ends them too
        self._starting: set[asyncio.Task[None]] = set()
        #: bumped by :meth:`lost`: a container whose start began before an engine outage is
        #: dead (the engine stopped it), even when its start returned after the outage began
        self.epoch = 0

    def target(self) -> int:
        """How many idle containers an image should have now."""
        size = self.boxes.config.warm_pool_size
        if size <= 0:
            return 0
        per = max(s.memory for s in self.shapes.values()) if self.shapes else (
            Limits().memory_bytes)
        room = idle_room(per)
        return size if room is None else min(size, max(1, room))


    def start(self, images: set[str]) -> None:
        """Serve ``images`` (with default limits until calls say otherwise) and (re)fill."""
        for image in sorted(images):
            self.queues.setdefault(image, deque())
            self.shapes.setdefault(image, engine.Shape.of(Limits()))
        if self._task is None:
            self._task = asyncio.create_task(self._refill_loop(), name="container-pool")
        self.refill.set()

    def lost(self) -> None:
        """The engine went away: every idle container is dead, removed when it is back (and
        so is one whose start is under way now: :attr:`epoch`)."""
        self.epoch += 1
        for boxes in self.queues.values():
            while boxes:
                box = boxes.popleft()
                box.dead = True
                self.boxes.stale.add(box)

    async def stop(self) -> None:
        """End the refill task and forget the queues (their containers are removed by
        the caller, with every other live one)."""
        await stop_task(self._task)
        self._task = None
        # a start under way would otherwise finish after the caller removed every live
        # container, and leave one (its cancellation removes what it started)
        for task in list(self._starting):
            await stop_task(task)

    async def _refill_loop(self) -> None:
        sem = asyncio.Semaphore(POOL_PARALLEL_STARTS)
        backoff = 0.5
        pending = self._starting

        async def fill_one(image: str) -> None:
            nonlocal backoff
            epoch = self.epoch
            async with sem:
                try:
                    box = await self.boxes.new(image=image, shape=self.shapes[image],
                                               role="pool", invocation="pool", workspace=None)
                except Exception as exc:
                    log.warning("warm pool: cannot start a container: %s", exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 30)
                    return
                finally:
                    self._filling[image] -= 1
                backoff = 0.5
                if self.boxes.closing:
                    await self.boxes.destroy(box)
                    return
                if self.epoch != epoch:  # the engine went away while it started: a dead box,
                    box.dead = True      # kept out of the queue and removed when it is back
                    self.boxes.stale.add(box)
                    return
                self.queues[image].append(box)
                self.refill.set()

        while not self.boxes.closing:
            await self.refill.wait()
            self.refill.clear()
            if not self.boxes.available[0]:  # the engine watch sets refill when it is back
                continue
            target = self.target()
            for image, boxes in self.queues.items():
                for box in [b for b in boxes if b.dead]:
                    boxes.remove(box)
                missing = target - len(boxes) - self._filling.get(image, 0)
                for _ in range(max(missing, 0)):
                    self._filling[image] = self._filling.get(image, 0) + 1
                    task = asyncio.create_task(fill_one(image))
                    pending.add(task)
                    task.add_done_callback(pending.discard)

    def serve(self, image: str, shape: engine.Shape, *, probe: bool) -> None:
        """A call of ``image`` with limits ``shape`` is about to take a container: serve the
        image from now on, refilled with the shape calls use (not the probe's)."""
        if image not in self.queues:
            self.queues[image] = deque()
            self.shapes[image] = shape
            self.refill.set()
        if not probe:
            self.shapes[image] = shape

    def take(self, image: str) -> Box | None:
        """An idle container of ``image`` (one whose runner is connected first), or None."""
        boxes = self.queues.get(image)
        if not boxes:
            return None
        for box in [b for b in boxes if b.dead or runner_lost(b)]:  # never hand out those
            boxes.remove(box)
            if not box.dead:
                self.boxes.destroy_later(box)
        # (all of those left are alive) prefer a container whose runner is already connected
        choice = next((b for b in boxes if b.endpoint.ready), boxes[0] if boxes else None)
        if choice is not None:
            boxes.remove(choice)
        if not boxes:  # otherwise the refill waits until this call is over (see oneshot.py)
            self.refill.set()
        return choice


def idle_room(per: int) -> int | None:
    """How many idle containers of ``per`` bytes of memory fit in :data:`POOL_MEMORY_SHARE`
    of the host's free memory now; None on an odd host (the caller trusts its setting)."""
    try:
        return int(procinfo.mem_available() * POOL_MEMORY_SHARE) // per
    except Exception:
        return None
