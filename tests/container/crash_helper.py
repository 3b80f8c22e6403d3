"""Run by test_lifecycle: start a backend, leave containers behind, then wait to be killed."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from sandboxd.backends.container import ContainerBackend
from sandboxd.models import Invocation, Limits, ToolKind
from sandboxd.protocol.plan import ExecutionPlan, Plan
from tests.container.conftest import make_settings, workspace
from tests.support.wait import async_wait_until


async def main(tmp: Path, instance: str) -> None:
    backend = ContainerBackend.from_settings(
        make_settings(tmp, instance=instance, warm_pool_size=1))
    await backend.start()
    ws = workspace(tmp, "crash-ws")
    session = Invocation(tool="shell", client="c", session="kept", workspace=ws,
                         plan=ExecutionPlan(kind=ToolKind.command, command=Plan.single(["true"])))
    await backend.run(session, time.monotonic() + 30)
    busy = Invocation(tool="shell", client="c", workspace=ws,
                      plan=ExecutionPlan(kind=ToolKind.command, limits=Limits(timeout_s=1000),
                                         command=Plan.single(["sleep", "1000"])))
    task = asyncio.create_task(backend.run(busy, time.monotonic() + 1000))
    # the session container, the busy call's container and the refilled pool's are there
    await async_wait_until(lambda: len([b for b in backend.boxes.live if b.cid]) >= 3,
                           timeout=120, what="three containers left behind")
    print("READY", flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
