"""A call admitted before a drain is waited for by it, even when the drain begins while the
call is still at its first ``await`` (its decision record): before, a call entered the
drain's in-flight set only once its decision was written, so a SIGTERM at that moment
stopped the daemon under a call whose client then never heard its result."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends.scripted import ScriptedBackend, prints
from sandboxd.backends.workspace.backend import WorkspaceBackend
from sandboxd.models import InvokeRequest, Status
from sandboxd.service import Sandboxd
from tests.scripted.test_service_on_scripted import settings_for
from tests.support.wait import async_wait_until

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_a_drain_waits_for_a_call_still_writing_its_decision(tmp_path: Path) -> None:
    service = Sandboxd(settings_for(tmp_path), backends={
        "workspace": WorkspaceBackend(quota_bytes=1 << 20, quota_entries=1000),
        "restricted": ScriptedBackend(script=prints("1\n")),
        "container": ScriptedBackend("container")})
    await service.start()
    try:
        reached, gate = asyncio.Event(), asyncio.Event()
        record = service.recorder.record

        async def held_decision(write: Any, **fields: Any) -> None:
            if write == service.audit.decision and not reached.is_set():
                reached.set()
                await gate.wait()  # the call sits at its first await, admitted
            await record(write, **fields)

        service.recorder.record = held_decision  # type: ignore[method-assign]
        call = asyncio.create_task(service.invoke(
            "local", "python", InvokeRequest(arguments={"code": "print(1)"})))
        await reached.wait()
        drain = asyncio.create_task(service.drain(30.0))
        await async_wait_until(lambda: service.draining, timeout=10, what="the drain begun")
        gate.set()
        await drain
        assert call.done(), "the drain ended before a call it had admitted"
        assert call.result().status is Status.ok
    finally:
        await service.close()
