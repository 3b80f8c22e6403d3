"""Session kernels at the backend's interface (a real backend: zygote, confined workers,
cgroups): restart (idle and mid-call), ``kernel_sessions``, calls of one session in order,
cancellation, the per-call CPU limit of a long-lived kernel, and ``close`` ending them all.
The HTTP side is in :mod:`tests.restricted.test_kernel`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from sandboxd.backends.base import CancelledAfterCleanup
from sandboxd.models import Limits, Result
from tests.restricted.conftest import BackendHarness
from tests.restricted.test_kernel import cgroup_dirs, kernel_process, wait_gone
from tests.support.plan import with_limits
from tests.support.wait import async_wait_until, wait_until


def run_in(harness: BackendHarness, session: str, workspace: Path, code: str,
           timeout_s: float = 20) -> Result:
    return harness.call(submit(harness, session, workspace, code, timeout_s))


async def submit(harness: BackendHarness, session: str, workspace: Path, code: str,
                 timeout_s: float = 20) -> Result:
    inv = harness.invocation(code, workspace).model_copy(update={"session": session})
    return await harness.backend.run(with_limits(inv, Limits(timeout_s=timeout_s)),
                                     time.monotonic() + timeout_s)


def cpu_seconds(pid: int) -> float:
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_in(pid: int, cpu_s: float = 0.2) -> Callable[[], bool]:
    """A check that is true once ``pid`` has burnt ``cpu_s`` more CPU seconds than now: a call's
    busy loop runs in that kernel."""
    start = cpu_seconds(pid)
    return lambda: cpu_seconds(pid) > start + cpu_s


def test_restart_ends_the_kernel_and_keeps_the_files(harness: BackendHarness) -> None:
    ws = harness.workspace()
    assert run_in(harness, "restart", ws, "x = 1\nopen('f', 'w').write('kept')").status == "ok"
    assert "restart" in harness.backend.kernel_sessions()
    proc = kernel_process(ws)
    dirs = cgroup_dirs(proc.pid)
    assert harness.call(harness.backend.restart_kernel("restart")) is True
    assert "restart" not in harness.backend.kernel_sessions()
    wait_gone(proc.pid, dirs, "the restarted kernel")
    assert harness.call(harness.backend.restart_kernel("restart")) is False  # idempotent
    res = run_in(harness, "restart", ws, "open('f').read()")
    assert res.value == "kept" and res.kernel is not None and res.kernel.fresh, res
    assert "NameError" in run_in(harness, "restart", ws, "x").stderr


def test_restart_during_a_call_ends_it_as_lost(harness: BackendHarness) -> None:
    ws = harness.workspace()
    run_in(harness, "busy", ws, "y = 1")
    burning = busy_in(kernel_process(ws).pid)
    fut = harness.submit(submit(harness, "busy", ws, "while True:\n    pass", timeout_s=60))
    wait_until(burning, timeout=30, what="the busy loop running in the kernel")
    started = time.monotonic()
    assert harness.call(harness.backend.restart_kernel("busy")) is True
    res = fut.result(30)
    assert time.monotonic() - started < 20
    assert res.kernel is not None and res.kernel.lost and res.kernel.reason == "restarted", res
    assert res.cleanup.verified, res.cleanup
    assert run_in(harness, "busy", ws, "1").kernel.fresh  # type: ignore[union-attr]


def test_calls_of_one_session_run_one_at_a_time_in_order(harness: BackendHarness) -> None:
    ws = harness.workspace()
    run_in(harness, "order", ws, "log = []")

    async def both() -> list[Result]:
        first = asyncio.ensure_future(submit(
            harness, "order", ws, "for i in range(200000):\n    pass\nlog.append('a')\nlog"))
        second = asyncio.ensure_future(submit(harness, "order", ws, "log.append('b')\nlog"))
        return list(await asyncio.gather(first, second))

    a, b = harness.call(both())
    assert a.value == ["a"] and b.value == ["a", "b"], (a, b)
    assert [a.kernel.calls, b.kernel.calls] == [2, 3]  # type: ignore[union-attr]


def cancel_kernel_call(harness: BackendHarness, sid: str, ws: Path,
                       code: str) -> CancelledAfterCleanup | None:
    """Cancel the call of ``code`` in the session's kernel once it burns CPU there."""
    proc = kernel_process(ws)

    async def cancel_one() -> CancelledAfterCleanup | None:
        burning = busy_in(proc.pid)
        task = asyncio.ensure_future(submit(harness, sid, ws, code, 60))
        await async_wait_until(burning, timeout=30, what="the busy loop running in the kernel")
        task.cancel()
        try:
            await task
        except CancelledAfterCleanup as exc:
            return exc
        return None

    return harness.call(cancel_one())


def test_cancellation_interrupts_and_keeps_the_kernel(harness: BackendHarness) -> None:
    """A cancel interrupts first (the session need not lose its state); a kernel back in its loop
    keeps its variables."""
    ws = harness.workspace()
    run_in(harness, "keep", ws, "z = 1")
    proc = kernel_process(ws)
    exc = cancel_kernel_call(harness, "keep", ws, "while True:\n    pass")
    assert exc is not None and exc.cleanup.verified, exc
    assert exc.kernel is not None and exc.kernel.interrupted and not exc.kernel.lost, exc.kernel
    assert "keep" in harness.backend.kernel_sessions()
    after = run_in(harness, "keep", ws, "z + 1")
    assert after.value == 2 and not after.kernel.fresh, after  # type: ignore[union-attr]
    assert kernel_process(ws).pid == proc.pid


def test_cancellation_kills_a_kernel_that_ignores_the_interrupt(harness: BackendHarness) -> None:
    ws = harness.workspace()
    run_in(harness, "cancel", ws, "z = 1")
    proc = kernel_process(ws)
    dirs = cgroup_dirs(proc.pid)
    exc = cancel_kernel_call(harness, "cancel", ws,
                             "while True:\n    try:\n        while True:\n            pass\n"
                             "    except KeyboardInterrupt:\n        pass")

    assert exc is not None and exc.cleanup.verified, exc
    assert exc.kernel is not None and exc.kernel.lost, exc.kernel
    wait_gone(proc.pid, dirs, "the cancelled call's kernel")
    assert "cancel" not in harness.backend.kernel_sessions()
    assert run_in(harness, "cancel", ws, "1").kernel.fresh  # type: ignore[union-attr]


def test_cpu_limit_is_per_call_not_per_kernel(harness: BackendHarness) -> None:
    """The first call (1 s: 2 CPU seconds) sets the kernel's RLIMIT_CPU; later calls burn
    more than that in total and the kernel lives on: the limit moves with every call (to what
    the kernel used plus the call's allowance)."""
    ws = harness.workspace()
    assert run_in(harness, "cpu", ws, "n = 0", timeout_s=1).status == "ok"
    pid = kernel_process(ws).pid
    for _ in range(40):
        before = cpu_seconds(pid)  # what the kernel had used when the call started
        res = run_in(harness, "cpu", ws, "for i in range(2000000):\n    n += 1\nn")
        assert res.status == "ok" and not res.kernel.lost, res  # type: ignore[union-attr]
        if cpu_seconds(pid) > 3.5:
            break
    else:
        pytest.fail("the kernel did not use 3.5 CPU seconds in 40 calls")
    assert kernel_process(ws).pid == pid
    # the soft limit was moved above what the kernel has used (the first call set it to 2 s)
    line = next(x for x in Path(f"/proc/{pid}/limits").read_text().splitlines()
                if x.startswith("Max cpu time"))
    soft = line.split()[3]
    # at least the last call's allowance (20 s timeout: 21 s) on top of what the kernel had used
    # when that call started (the call's own CPU time comes out of its allowance)
    assert soft != "unlimited" and int(soft) >= 21 + int(before) - 1, line


def test_close_ends_every_kernel(tmp_path: Path) -> None:
    h = BackendHarness(tmp_path, "kclose")
    try:
        workspaces = [h.workspace() for _ in range(2)]
        for i, ws in enumerate(workspaces):
            assert run_in(h, f"s{i}", ws, "a = 1").status == "ok"
        assert h.backend.kernel_sessions() == {"s0", "s1"}
        procs = [kernel_process(ws) for ws in workspaces]
        dirs = [d for p in procs for d in cgroup_dirs(p.pid)]
    finally:
        h.close()
    for p in procs:
        wait_gone(p.pid, dirs, "kernels after close")
    assert h.backend.kernel_sessions() == set()


def test_closing_a_session_refuses_its_queued_calls(harness: BackendHarness) -> None:
    """A call still queued behind the session's close must not start a new kernel."""
    ws = harness.workspace()
    run_in(harness, "closing", ws, "a = 1")
    burning = busy_in(kernel_process(ws).pid)

    async def scenario() -> tuple[Result, Result]:
        busy = asyncio.ensure_future(submit(harness, "closing", ws, "while True:\n    pass", 60))
        await async_wait_until(burning, timeout=30, what="the busy loop running in the kernel")
        queued = asyncio.ensure_future(submit(harness, "closing", ws, "b = 2"))
        await asyncio.sleep(0)  # it runs up to the session's lock (no await before it)
        await harness.backend.close_session("closing")
        return await busy, await queued

    busy, queued = harness.call(scenario())
    assert busy.kernel is not None and busy.kernel.lost, busy
    assert busy.kernel.reason == "the session was closed", busy
    assert queued.status == "error" and queued.message == "the session was closed", queued
    assert "closing" not in harness.backend.kernel_sessions()
    assert "closing" not in harness.backend.kernels.kernels
    wait_until(lambda: not processes_in(ws), timeout=10,
               what="the kernel of the closed session to end", detail=lambda: processes_in(ws))


def processes_in(workspace: Path) -> list[int]:
    """Live processes working in ``workspace``."""
    out = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if Path(proc.cwd()) == workspace and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
    return out


def test_a_dead_zygote_takes_its_kernels_and_the_next_call_is_fresh(tmp_path: Path) -> None:
    h = BackendHarness(tmp_path, "kzyg")
    try:
        ws = h.workspace()
        assert run_in(h, "z", ws, "a = 1\nopen('f', 'w').write('kept')").status == "ok"
        kernel = kernel_process(ws)
        dirs = cgroup_dirs(kernel.pid)
        zygote = h.backend.zygote
        assert zygote is not None
        zygote.kill()
        wait_gone(kernel.pid, [], "a kernel of a dead zygote")  # its parent-death signal
        res = run_in(h, "z", ws, "open('f').read()")
        assert res.status == "ok" and res.value == "kept", res
        assert res.kernel is not None and res.kernel.fresh, res
        assert h.backend.zygote is not zygote
        wait_gone(kernel.pid, dirs, "the dead kernel's cgroup")
    finally:
        h.close()


def test_a_call_whose_time_ran_out_in_the_queue_leaves_the_kernel(
        harness: BackendHarness) -> None:
    ws = harness.workspace()
    run_in(harness, "queue", ws, "kept = 'yes'")

    async def scenario() -> tuple[Result, Result]:
        slow = asyncio.ensure_future(submit(
            harness, "queue", ws, "for i in range(3000000):\n    pass", 30))
        await asyncio.sleep(0)  # it takes the session's lock first (no await before it)
        starved = asyncio.ensure_future(submit(harness, "queue", ws, "kept", 0.1))
        return await slow, await starved

    slow, starved = harness.call(scenario())
    assert slow.status == "ok", slow
    if starved.status == "ok":  # the slow call was quicker than 0.1 s on this host
        assert starved.value == "yes"
    else:
        assert starved.termination.reason.value == "wall_timeout", starved
        assert starved.kernel is not None and not starved.kernel.lost, starved
    res = run_in(harness, "queue", ws, "kept")
    assert res.value == "yes" and not res.kernel.fresh, res  # type: ignore[union-attr]
