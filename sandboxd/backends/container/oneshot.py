"""One-shot calls: a warm container when the pool can serve the call (no named network, a
fresh empty workspace), else a cold one; either way it runs once and is destroyed."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from sandboxd.backends.base import CancelledAfterCleanup
from sandboxd.backends.container import engine
from sandboxd.backends.container.boxes import Box, Boxes, gone
from sandboxd.backends.container.calls import (
    build_result,
    exchange,
    oom_killed_after,
    timeout_result,
)
from sandboxd.backends.container.pool import WarmPool
from sandboxd.models import Invocation, Limits, Result
from sandboxd.protocol.call import WorkerRequest
from sandboxd.util.deadline import within

PROBE_CLIENT = "sandboxd-probe"


async def run_oneshot(boxes: Boxes, pool: WarmPool, invocation: Invocation, limits: Limits,
                      deadline: float, request: WorkerRequest, image: str,
                      shape: engine.Shape, started: float) -> Result:
    """Run one call in a container of its own, then refill the pool."""
    try:
        return await _oneshot(boxes, pool, invocation, limits, deadline, request, image, shape,
                              started)
    finally:
        # refill once this call's container is gone: a container start competes with the
        # call for the engine and the CPU, so starting it afterwards keeps latency low
        pool.refill.set()


async def _oneshot(boxes: Boxes, pool: WarmPool, invocation: Invocation, limits: Limits,
                   deadline: float, request: WorkerRequest, image: str, shape: engine.Shape,
                   started: float) -> Result:
    box: Box | None = None
    try:
        own_tmpfs = _is_empty_dir(invocation.workspace)
        poolable = (invocation.plan.network is None and invocation.plan.egress is None
                    and own_tmpfs)
        if poolable:
            pool.serve(image, shape, probe=invocation.client == PROBE_CLIENT)
            box = pool.take(image)
        if box is None:
            made, new = await within(
                boxes.new(image=image, shape=shape, role="oneshot",
                          invocation=invocation.id,
                          workspace=None if own_tmpfs else invocation.workspace,
                          network=invocation.plan.network, uid=invocation.uid,
                          egress=invocation.plan.egress, client=invocation.client,
                          tool=invocation.tool),
                deadline - time.monotonic())
            if not made:  # Boxes.new removed what it had started
                raise TimeoutError
            box = new
        await boxes.update_shape(box, shape)
        outcome = await exchange(box, request, limits, deadline, invocation.events)
    except asyncio.CancelledError as exc:
        if box is not None:
            verified = await boxes.destroy_shielded(box)
            raise CancelledAfterCleanup(verified, gone(box, verified)) from None
        if isinstance(exc, CancelledAfterCleanup):
            raise
        raise CancelledAfterCleanup(True, "no container was started") from None
    except TimeoutError:
        verified = await boxes.destroy_shielded(box) if box is not None else True
        return timeout_result(invocation, limits, started, verified, gone(box, verified))
    except BaseException:
        if box is not None:
            await boxes.destroy_shielded(box)
        raise
    oom = await oom_killed_after(boxes, box, outcome)
    verified, detail = await boxes.end_shielded(box, fast=outcome.lost is None)
    return build_result(invocation, limits, outcome, started, verified, oom=oom,
                        detail=detail, engine_error=boxes.engine_error)



def _is_empty_dir(path: Path) -> bool:
    try:
        with os.scandir(path) as it:
            return next(it, None) is None
    except OSError:
        return False
