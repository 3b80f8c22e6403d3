"""Idle session containers are paused, so that an idle session holds no CPU.

A session container with no call for ``session_pause_after_s`` (0: never) is frozen with the
engine's pause (the cgroup freezer: its processes get no CPU; its memory stays charged to it,
there is no swap) and thawed at the start of its next call, before anything talks to its
runner, and before a kernel restart. Removal needs no thaw (the engine removes a paused
container), but :meth:`.Boxes.destroy` thaws first anyway, best effort.

The race: a session's calls are counted (:meth:`Idle.using`, synchronous, before the call's
first ``await``), and both the pause and the thaw hold the box's own lock
(:attr:`.Box.freeze`). A pause checks, under the lock, that no call is counted; a call that
starts while a pause is in flight waits for it, then thaws. So no container is ever paused
while a call runs in it. Every engine call runs in the backend's thread pool, never on the
event loop. A pause that fails is logged and the container stays as the engine says; a thaw
that fails raises :class:`ThawFailed` (the session drops that container: its next call gets a
fresh one). Idle pauses and thaws are logged, not audited: the audit log records what clients
and admins do, and the backend has no audit handle. A client's own pause (E2B's
``Sandbox.pause()``) is this same pause, asked for now (:meth:`Idle.pause` with ``now``): the
service audits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterator, Mapping

from sandboxd.backends.container import engine
from sandboxd.backends.container.boxes import Box, Boxes
from sandboxd.backends.container.dockerapi import NoAnswer
from sandboxd.util.deadline import stop_task

log = logging.getLogger("sandboxd.container")

SessionKey = tuple[str, str, str]  # (client, session, image), as in sessions.py
TICK_MAX_S = 5.0  # the idle check runs at least this often


class ThawFailed(Exception):
    """A paused session container could not be thawed."""


class Idle:
    """Counts each session container's calls and pauses those idle long enough."""

    def __init__(self, boxes: Boxes, after_s: float) -> None:
        self.boxes = boxes
        self.after_s = after_s
        self._busy: Counter[SessionKey] = Counter()  # calls using the session's container
        self._since: dict[SessionKey, float] = {}  # when its last call ended
        self._task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def using(self, key: SessionKey) -> Iterator[None]:
        """Count a call (or a kernel operation) of the session for as long as it runs: its
        container is not paused meanwhile. Enter it before the call's first ``await``."""
        self._busy[key] += 1
        try:
            yield
        finally:
            self._busy[key] -= 1
            if self._busy[key] <= 0:
                del self._busy[key]
            self._since[key] = time.monotonic()

    def forget(self, key: SessionKey) -> None:
        """The session's container is gone for good (its session closed)."""
        self._since.pop(key, None)

    def start(self, by_key: Mapping[SessionKey, Box]) -> None:
        """Start the idle check over ``by_key`` (the live session containers); no-op when
        pausing is off."""
        if self.after_s > 0 and self._task is None:
            self._task = asyncio.create_task(self._loop(by_key), name="container-idle")

    async def stop(self) -> None:
        """End the idle check."""
        await stop_task(self._task)
        self._task = None

    async def _loop(self, by_key: Mapping[SessionKey, Box]) -> None:
        tick = max(0.05, min(self.after_s / 4, TICK_MAX_S))
        while not self.boxes.closing:
            await asyncio.sleep(tick)
            if not self.boxes.available[0]:
                continue
            try:
                await self.pause_idle(by_key)
            except Exception:  # never the end of the loop
                log.exception("the idle check of session containers failed")

    async def pause_idle(self, by_key: Mapping[SessionKey, Box]) -> list[SessionKey]:
        """Pause every session container idle for ``after_s``; returns their keys."""
        paused = []
        for key, box in list(by_key.items()):
            if self._idle(key, box) and await self.pause(key, box, by_key):
                paused.append(key)
        return paused

    def _idle(self, key: SessionKey, box: Box) -> bool:
        since = self._since.setdefault(key, time.monotonic())
        return self._pausable(key, box) and time.monotonic() - since >= self.after_s

    def _pausable(self, key: SessionKey, box: Box) -> bool:
        return (not box.dead and not box.paused and box.cid is not None
                and not self._busy.get(key))

    async def pause(self, key: SessionKey, box: Box,
                    by_key: Mapping[SessionKey, Box], *, now: bool = False) -> bool:
        """Pause one session container if it is still idle (checked under its lock);
        ``now``: asked for by the session's client, so however short its idle spell, but
        never while a call is counted."""
        async with box.freeze:
            ready = self._pausable(key, box) if now else self._idle(key, box)
            if not ready or by_key.get(key) is not box or box.cid is None:
                return False
            try:
                await self.boxes.engine(engine.pause, self.boxes.client, box.cid)
            except Exception as exc:
                if isinstance(exc, NoAnswer):
                    # no answer: it may be paused; the next call thaws it either way
                    box.paused = True
                    self.boxes.engine_failed(exc)
                self._since[key] = time.monotonic()  # tried again after another idle spell
                log.warning("session %s: its container %s could not be paused: %s",
                            key[1], box.name, exc)
                return False
            box.paused = True
        log.info("session %s: container %s paused (%s)", key[1], box.name,
                 "asked for" if now else f"no call for {self.after_s:g} s")
        return True

    async def thaw(self, key: SessionKey, box: Box) -> None:
        """Thaw the container if it is paused (waiting for a pause in flight first); raises
        :class:`ThawFailed` when the engine cannot."""
        if not box.paused and not box.freeze.locked():
            return  # the common case: no lock round trip
        async with box.freeze:
            if not box.paused or box.dead:
                return
            started = time.monotonic()
            try:
                await self.boxes.engine(engine.unpause, self.boxes.client, box.cid or box.name)
            except Exception as exc:
                if isinstance(exc, NoAnswer):
                    self.boxes.engine_failed(exc)
                log.error("session %s: its paused container %s could not be thawed: %s",
                          key[1], box.name, exc)
                raise ThawFailed(f"the session's paused container {box.name} could not be "
                                 f"resumed: {getattr(exc, 'explanation', None) or exc}") from exc
            box.paused = False
        log.info("session %s: container %s thawed in %.1f ms", key[1], box.name,
                 (time.monotonic() - started) * 1000)
