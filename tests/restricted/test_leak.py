"""Leak test: 200 calls that time out or exceed their memory limit leave no process, cgroup
or temporary directory behind."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psutil
import pytest

from sandboxd.backends.restricted.zygote import STANDBY_WORKERS
from sandboxd.models import Limits, Reason
from tests.restricted.conftest import BackendHarness
from tests.support.plan import with_limits
from tests.support.scale import scaled
from tests.support.wait import wait_until

TIMEOUT_CODE = "while True:\n    pass"
MEMORY_CODE = "x = []\nwhile True:\n    x.append('a' * 10**6)"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_200_failing_calls_leave_nothing(harness: BackendHarness) -> None:
    harness.call(harness.backend.probe())  # its scratch directory must go away as well
    ws = harness.workspace()

    async def one(i: int) -> tuple[int, object]:
        if i % 2:
            inv = harness.invocation(TIMEOUT_CODE, workspace=ws)
            lim = Limits(timeout_s=0.2)
        else:
            inv = harness.invocation(MEMORY_CODE, workspace=ws)
            # generous: the limit must end these calls, not the clock (slow emulated hosts)
            lim = Limits(timeout_s=120, memory_bytes=32 * 1024 * 1024)
        return i, await harness.backend.run(with_limits(inv, lim), time.monotonic() + lim.timeout_s)

    async def all_calls() -> list:
        sem = asyncio.Semaphore(4)

        async def bounded(i: int) -> tuple[int, object]:
            async with sem:
                return await one(i)

        return await asyncio.gather(*[bounded(i) for i in range(rounds)])

    rounds = scaled(200, floor=40)  # fewer under emulation (tests/support/scale.py)
    results = harness.call(all_calls(), timeout=1200)
    assert len(results) == rounds
    for i, res in results:
        expected = Reason.wall_timeout if i % 2 else Reason.memory_limit
        assert res.termination.reason is expected, (i, res)
        assert res.cleanup.verified, (i, res.cleanup.detail)

    zygote = harness.backend._zygote
    assert zygote is not None

    def left() -> tuple[list[psutil.Process], list[Path]]:
        children = psutil.Process(zygote.pid).children(recursive=True)
        dirs = [d for base in harness.backend.layout.bases.values()
                for d in base.iterdir() if d.is_dir()]
        return children, dirs

    def settled() -> tuple[list[psutil.Process], list[Path]] | None:
        children, dirs = left()
        cgroups = STANDBY_WORKERS * max(1, len(harness.backend.layout.bases))
        if len(children) <= STANDBY_WORKERS and len(dirs) <= cgroups:  # count-ok: a leak bound
            return children, dirs
        return None

    children, dirs = wait_until(settled, timeout=10, what="only standby workers left",
                                detail=left)
    # whatever is left is idle standby workers, each in its own cgroup
    for child in children:
        assert child.cpu_times().user < 1.0
    names = {d.name for d in dirs}
    assert len(names) <= STANDBY_WORKERS
    # no worker escaped the zygote's tree: nothing in any leftover cgroup but the standbys
    standby_pids = {c.pid for c in children}
    for d in dirs:
        try:
            procs = {int(p) for p in (d / "cgroup.procs").read_text().split()}
        except FileNotFoundError:
            continue  # a finished call's cgroup, which the zygote removed meanwhile
        assert procs <= standby_pids
    # the workspace holds nothing the failed calls left behind, no temp dirs appeared
    assert list(ws.iterdir()) == []
    assert not list(harness.state_dir.glob("restricted-probe-*"))
