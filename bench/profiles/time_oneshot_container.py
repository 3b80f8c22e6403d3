"""Where a one-shot container call's time goes: the container backend in process,
a warm pool of 2, sequential ``echo 1`` calls (each after the pool has refilled), the exchange
with the runner and the container's end timed apart.

    PYTHONPATH=$PWD .venv/bin/python bench/profiles/time_oneshot_container.py [--calls 12]

``PYTHONPATH=<another checkout>``: that tree's backend (the helpers come from this one).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent.parent
sys.path.append(str(HERE))  # tests.container's helpers; sandboxd first from PYTHONPATH

import sandboxd.backends.container.oneshot as oneshot  # noqa: E402
from sandboxd.backends.container.backend import ContainerBackend  # noqa: E402
from sandboxd.backends.container.boxes import Boxes  # noqa: E402
from tests.container.conftest import make_settings, run, workspace  # noqa: E402
from tests.support.wait import async_wait_until  # noqa: E402

TIMES: dict[str, list[float]] = {}


def timed(name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await fn(*args, **kwargs)
        finally:
            TIMES.setdefault(name, []).append(time.perf_counter() - started)
    return wrapper


async def main(calls: int) -> None:
    oneshot.exchange = timed("exchange with the runner", oneshot.exchange)  # type: ignore[assignment]
    if hasattr(Boxes, "end"):  # this tree: the kernel's proof, the removal afterwards
        Boxes.end = timed("the container's end", Boxes.end)  # type: ignore[method-assign]
    else:  # before (main at 5724561): the engine's removal, waited for
        Boxes.destroy_shielded = timed(  # type: ignore[method-assign]
            "the container's end", Boxes.destroy_shielded)
    tmp = Path(tempfile.mkdtemp())
    backend = ContainerBackend.from_settings(make_settings(tmp, warm_pool_size=2))
    await backend.start()
    total = []
    try:
        for i in range(calls):
            await async_wait_until(lambda: sum(map(len, backend.pool.queues.values())) >= 2,
                                   timeout=60, what="a full warm pool")
            started = time.perf_counter()
            result = await run(backend, workspace(tmp, f"w{i}"), argv=["echo", "1"])
            total.append(time.perf_counter() - started)
            assert result.stdout == "1\n", result
    finally:
        await backend.close()
    print(f"one-shot call p50 {statistics.median(total) * 1000:.1f} ms ({calls} calls)")
    for name, values in TIMES.items():
        print(f"  {name}: p50 {statistics.median(values) * 1000:.1f} ms")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=12)
    asyncio.run(main(ap.parse_args().calls))
