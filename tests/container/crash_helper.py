"""Run by test_lifecycle: start a backend, leave containers behind, then wait to be killed."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from sandboxd.backends.container import ContainerBackend
from sandboxd.models import Invocation, Limits, ToolKind
from tests.container.conftest import make_settings, workspace


async def main(tmp: Path, instance: str) -> None:
    backend = ContainerBackend.from_settings(
        make_settings(tmp, instance=instance, warm_pool_size=1))
    await backend.start()
    ws = workspace(tmp, "crash-ws")
    session = Invocation(tool="shell", kind=ToolKind.command, client="c", session="kept",
                         workspace=ws, argv=["true"])
    await backend.run(session, Limits(), time.monotonic() + 30)
    busy = Invocation(tool="shell", kind=ToolKind.command, client="c", workspace=ws,
                      argv=["sleep", "1000"])
    task = asyncio.create_task(backend.run(busy, Limits(timeout_s=1000), time.monotonic() + 1000))
    await asyncio.sleep(1.5)
    print("READY", flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
