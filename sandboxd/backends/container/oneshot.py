"""One-shot calls: a warm container when the pool can serve the call (no named network, a
fresh empty workspace), else a cold one; either way it runs once and is destroyed."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from sandboxd.backends.base import CancelledAfterCleanup
from sandboxd.backends.container.boxes import Box, Boxes, gone
from sandboxd.backends.container.calls import (
    ContainerCall,
    build_result,
    exchange,
    not_started,
    oom_killed_after,
    timeout_result,
)
from sandboxd.backends.container.pool import WarmPool
from sandboxd.models import Result

PROBE_CLIENT = "sandboxd-probe"


async def run_oneshot(boxes: Boxes, pool: WarmPool, call: ContainerCall) -> Result:
    """Run one call in a container of its own, then refill the pool."""
    try:
        return await _oneshot(boxes, pool, call)
    finally:
        # refill once this call's container is gone: a container start competes with the
        # call for the engine and the CPU, so starting it afterwards keeps latency low
        pool.refill.set()


async def _oneshot(boxes: Boxes, pool: WarmPool, call: ContainerCall) -> Result:
    box: Box | None = None
    try:
        box = await _container(boxes, pool, call)
        await boxes.update_shape(box, call.shape)
        outcome = await exchange(box, call)
    except asyncio.CancelledError as exc:
        if box is None:
            raise not_started(exc) from None
        verified = await boxes.destroy_shielded(box)
        raise CancelledAfterCleanup(verified, gone(box, verified)) from None
    except TimeoutError:
        verified = await boxes.destroy_shielded(box) if box is not None else True
        return timeout_result(call.call, verified, gone(box, verified))
    except BaseException:
        if box is not None:
            await boxes.destroy_shielded(box)
        raise
    oom = await oom_killed_after(boxes, box, outcome)
    verified, detail = await boxes.end_shielded(box, fast=outcome.lost is None)
    return build_result(call.call, outcome, verified, oom=oom, detail=detail,
                        engine_error=boxes.engine_error)


async def _container(boxes: Boxes, pool: WarmPool, call: ContainerCall) -> Box:
    """The call's container: a warm one when the pool can serve the call (no named network,
    no egress, a fresh empty workspace), else a new one (TimeoutError: not by the deadline;
    whatever :meth:`Boxes.new` had started is removed)."""
    invocation, plan = call.invocation, call.invocation.plan
    own_tmpfs = _is_empty_dir(invocation.workspace)
    if plan.network is None and plan.egress is None and own_tmpfs:
        pool.serve(call.image, call.shape, probe=invocation.client == PROBE_CLIENT)
        box = pool.take(call.image)
        if box is not None:
            return box
    new = await boxes.new_within(
        boxes.new(image=call.image, shape=call.shape, role="oneshot", invocation=invocation.id,
                  workspace=None if own_tmpfs else invocation.workspace,
                  network=plan.network, uid=invocation.uid, egress=plan.egress,
                  client=invocation.client, tool=invocation.tool),
        call.call.left())
    if new is None:
        raise TimeoutError
    return new


def _is_empty_dir(path: Path) -> bool:
    try:
        with os.scandir(path) as it:
            return next(it, None) is None
    except OSError:
        return False
