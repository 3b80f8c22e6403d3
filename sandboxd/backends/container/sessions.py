"""Session containers: one long-lived container per (client, session, image) with the
session's workspace bind-mounted at ``/workspace``; each call is one fork of its runner. The
container is removed by ``close_session``, at shutdown, and after any call that hit a limit
(the next call starts a fresh one on the same workspace)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sandboxd.backends.base import CancelledAfterCleanup
from sandboxd.backends.container import engine
from sandboxd.backends.container.boxes import Box, Boxes, gone
from sandboxd.backends.container.calls import build_result, exchange, timeout_result
from sandboxd.deadline import within
from sandboxd.models import Invocation, Limits, Result

SessionKey = tuple[str, str, str]  # (client, session, image)


class SessionContainers:
    """The live session containers, one per :data:`SessionKey`."""

    def __init__(self, boxes: Boxes) -> None:
        self.boxes = boxes
        self.by_key: dict[SessionKey, Box] = {}
        self._locks: dict[SessionKey, asyncio.Lock] = {}

    def lost(self) -> None:
        """The engine went away: every session container is dead, removed when it is back."""
        for key, box in list(self.by_key.items()):
            box.dead = True
            del self.by_key[key]
            self.boxes.stale.add(box)

    async def _box(self, key: SessionKey, invocation: Invocation, image: str,
                   shape: engine.Shape, deadline: float) -> Box:
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            box = self.by_key.get(key)
            if box is not None and not box.dead:
                return box
            made, box = await within(
                self.boxes.new(image=image, shape=shape, role="session",
                               invocation=invocation.id, workspace=invocation.workspace,
                               network=invocation.network, session=invocation.session,
                               uid=invocation.uid),
                deadline - time.monotonic())
            if not made:
                raise TimeoutError
            self.by_key[key] = box
            return box

    async def run(self, invocation: Invocation, limits: Limits, deadline: float,
                  request: dict[str, Any], image: str, shape: engine.Shape,
                  started: float) -> Result:
        """Run one call of a session in its container (started here when it has none)."""
        assert invocation.session is not None
        key = (invocation.client, invocation.session, image)
        box: Box | None = None
        try:
            box = await self._box(key, invocation, image, shape, deadline)
            await self.boxes.update_shape(box, shape)
            outcome = await exchange(box, request, limits, deadline)
        except asyncio.CancelledError as exc:
            if box is not None:
                verified = await self.drop(key, box)
                raise CancelledAfterCleanup(verified, gone(box, verified)) from None
            if isinstance(exc, CancelledAfterCleanup):
                raise
            raise CancelledAfterCleanup(True, "no container was started") from None
        except TimeoutError:
            verified = await self.drop(key, box) if box is not None else True
            return timeout_result(invocation, limits, started, verified, gone(box, verified))
        except BaseException:
            if box is not None:
                await self.drop(key, box)
            raise
        if outcome.lost and box.dead:
            # another call of this session hit a limit and its container was removed
            outcome.lost = None
            outcome.superseded = True
        if outcome.clean:
            verified = bool(outcome.record.get("group_gone", True))
            return build_result(invocation, limits, outcome, started, verified, oom=False,
                                detail="session container kept; the call's processes are gone"
                                if verified else "processes of the call may be left",
                                engine_error=self.boxes.engine_error)
        oom = outcome.needs_oom_check and await self.boxes.engine(
            engine.oom_killed, self.boxes.client, box.cid or box.name)
        verified = await self.drop(key, box)
        return build_result(invocation, limits, outcome, started, verified, oom=oom,
                            detail=gone(box, verified) + " (the session gets a new one)",
                            engine_error=self.boxes.engine_error)

    async def drop(self, key: SessionKey, box: Box) -> bool:
        """Forget and remove one session container; True once its removal is confirmed."""
        if self.by_key.get(key) is box:
            del self.by_key[key]
        return await self.boxes.destroy_shielded(box)

    async def close(self, session_id: str) -> None:
        """Remove the session's container(s). Idempotent."""
        keys = [k for k in self.by_key if k[1] == session_id]
        await asyncio.gather(*(self.drop(k, self.by_key[k]) for k in keys),
                             return_exceptions=True)
        for key in keys:
            self._locks.pop(key, None)
