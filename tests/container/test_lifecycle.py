"""Crash recovery and leak checks: nothing with our label survives."""

from __future__ import annotations

import asyncio
import random
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends.base import CancelledAfterCleanup
from sandboxd.backends.container import ContainerBackend
from sandboxd.models import Limits, Reason
from sandboxd.protocol.plan import ExecutionPlan, Plan
from tests.support.plan import with_limits
from tests.support.scale import rounds as scaled_rounds

from .conftest import DEFAULT_CALL_S, labelled, make_settings, run, workspace

REPO = Path(__file__).resolve().parents[2]


async def test_sigkilled_backend_leftovers_are_removed_at_next_start(
        docker_client: Any, tmp_path: Path) -> None:
    instance = f"crash{secrets.token_hex(4)}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.container.crash_helper", str(tmp_path), instance],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "READY", proc.stderr.read() if proc.stderr else ""
        left = {c.id for c in labelled(docker_client, instance)}
        # a session container, the busy one-shot container and the warm pool
        assert len(left) >= 3, left
    finally:
        proc.kill()  # SIGKILL: no cleanup code runs
        proc.wait(10)
    assert {c.id for c in labelled(docker_client, instance)} == left  # really left behind
    backend = ContainerBackend.from_settings(
        make_settings(tmp_path, instance=instance, warm_pool_size=0))
    await backend.start()
    try:
        assert labelled(docker_client, instance) == []
        assert backend.availability() == (True, None)
    finally:
        await backend.close()


async def test_200_timing_out_calls_leave_no_container(docker_client: Any,
                                                       tmp_path: Path) -> None:
    backend = ContainerBackend.from_settings(make_settings(tmp_path, warm_pool_size=2))
    await backend.start()
    instance = backend.config.instance_name
    rng = random.Random(4)
    sem = asyncio.Semaphore(12)
    ws = workspace(tmp_path, "shared")

    async def one(i: int) -> Reason:
        # tiny timeouts end calls in every phase: creating, starting, connecting, running
        timeout = rng.choice([0.001, 0.01, 0.05, 0.1, 0.2, 0.4, 0.8])
        async with sem:
            session = f"s{i % 5}" if i % 3 == 0 else None
            res = await run(backend, ws if session else workspace(tmp_path, f"w{i}"),
                            argv=["sleep", "100"], session=session,
                            limits=Limits(timeout_s=timeout))
            assert res.cleanup.verified, res.cleanup
            if res.termination.reason is Reason.cancelled:
                # a concurrent call of the same session timed out and took the container
                assert session is not None, res
                assert res.message and "another call of the session" in res.message
            assert res.termination.reason in (Reason.wall_timeout, Reason.cancelled), (
                timeout, session, res)
            return res.termination.reason

    started = time.monotonic()
    # 8 under emulation (tests/support/scale.py), all at once: 20 took 228 s of CI's VM time
    # (2026-11-29); 8 still end in every phase of a call (tiny timeouts), one-shot and in sessions
    rounds = scaled_rounds(200, emulated=8)
    reasons = await asyncio.gather(*(one(i) for i in range(rounds)))
    assert Reason.wall_timeout in set(reasons)
    assert set(reasons) <= {Reason.wall_timeout, Reason.cancelled}
    assert reasons.count(Reason.wall_timeout) >= rounds * 0.9
    for s in range(5):
        await backend.close_session(f"s{s}")
    pool = {b.cid for boxes in backend.pool.queues.values() for b in boxes}
    await backend.close()
    assert labelled(docker_client, instance) == [], f"pool was {pool}"
    print(f"{rounds} timing-out calls in {time.monotonic() - started:.1f} s")


@pytest.mark.parametrize("cancel_after", [0.0, 0.05, 0.3, 1.0])
async def test_cancelled_calls_leave_no_container(docker_client: Any, tmp_path: Path,
                                                  cancel_after: float) -> None:
    backend = ContainerBackend.from_settings(make_settings(tmp_path, warm_pool_size=0))
    await backend.start()
    try:
        ws = workspace(tmp_path, "c")
        tasks = [asyncio.create_task(run(backend, ws, argv=["sleep", "100"], timeout=60)),
                 asyncio.create_task(run(backend, ws, argv=["sleep", "100"], timeout=60,
                                         session="cancel-me"))]
        await asyncio.sleep(cancel_after)  # sleep-ok: cancels at set moments of the calls' lives
        for t in tasks:
            t.cancel()
        for t in tasks:
            with pytest.raises(CancelledAfterCleanup) as info:
                await t
            assert info.value.cleanup.verified, info.value.cleanup
        assert labelled(docker_client, backend.config.instance_name) == []
    finally:
        await backend.close()


@pytest.mark.parametrize("session", [None, "made-then-cancelled"])
async def test_a_container_made_as_its_call_is_cancelled_is_removed(
        docker_client: Any, tmp_path: Path, session: str | None) -> None:
    """The cancel lands just as the engine has made the call's container (the moment the
    timed cases above hit only by chance): the container is removed before the cancellation
    goes on, and the cancellation names it."""
    backend = ContainerBackend.from_settings(make_settings(tmp_path, warm_pool_size=0))
    await backend.start()
    made: list[str] = []
    real_new = backend.boxes.new

    async def new_then_cancelled(**spec: Any) -> Any:
        box = await real_new(**spec)
        made.append(box.name)
        task = asyncio.current_task()
        assert task is not None
        # the call's own task, which awaits this creation: cancelled now that it is made
        next(t for t in asyncio.all_tasks() if t is not task and t.get_name() == "call").cancel()
        return box

    backend.boxes.new = new_then_cancelled  # type: ignore[method-assign]
    try:
        call = asyncio.create_task(run(backend, workspace(tmp_path, "c"), argv=["true"],
                                       timeout=60, session=session), name="call")
        with pytest.raises(CancelledAfterCleanup) as info:
            await call
        assert len(made) == 1, made
        assert info.value.cleanup.verified, info.value.cleanup
        assert info.value.cleanup.detail == f"container {made[0]} removed", info.value.cleanup
        assert labelled(docker_client, backend.config.instance_name) == []
    finally:
        await backend.close()


async def test_unavailable_when_the_image_is_missing(docker_client: Any,
                                                     tmp_path: Path) -> None:
    backend = ContainerBackend.from_settings(make_settings(
        tmp_path, python_image="sandboxd/nope:missing", shell_image="sandboxd/nope:missing"))
    await backend.start()
    ok, why = backend.availability()
    assert not ok
    assert why is not None and "sandboxd images build" in why
    await backend.close()


async def test_unavailable_when_the_engine_is_unreachable(tmp_path: Path) -> None:
    backend = ContainerBackend.from_settings(make_settings(
        tmp_path, docker_url=f"unix://{tmp_path}/no-such-docker.sock"))
    await backend.start()
    ok, why = backend.availability()
    assert not ok
    assert why is not None and "unreachable" in why
    report = await backend.probe()
    assert not report.ok
    await backend.close()


async def test_missing_image_named_by_a_policy_is_a_clear_error(docker_client: Any,
                                                                tmp_path: Path) -> None:
    from sandboxd.models import Invocation, Status, ToolKind

    backend = ContainerBackend.from_settings(make_settings(tmp_path, warm_pool_size=0))
    await backend.start()
    try:
        inv = Invocation(tool="shell", client="c", workspace=workspace(tmp_path, "w"),
                         plan=ExecutionPlan(kind=ToolKind.command, command=Plan.single(["true"]),
                                            image="sandboxd/does-not-exist:1"))
        res = await backend.run(with_limits(inv, Limits()), time.monotonic() + DEFAULT_CALL_S)
        assert res.status is Status.error
        assert res.message and "could not be started" in res.message
        assert labelled(docker_client, backend.config.instance_name) == []
    finally:
        await backend.close()


async def test_image_without_the_runner_fails_fast(docker_client: Any, tmp_path: Path) -> None:
    """An image whose entrypoint is not the runner: a clear error, not a wall timeout."""
    from sandboxd.backends.container import calls as calls_module
    from sandboxd.models import Invocation, Status, ToolKind

    tag = f"sandboxd-test/norunner:{secrets.token_hex(3)}"
    base = docker_client.images.get(make_settings(tmp_path).python_image)
    container = docker_client.containers.create(base.id, entrypoint=["sleep"],
                                                command=["1000"])
    container.commit(repository=tag.split(":")[0], tag=tag.split(":")[1],
                     changes=['ENTRYPOINT ["sleep"]', 'CMD ["1000"]'])
    container.remove(force=True)
    old = calls_module.RUNNER_CONNECT_S
    calls_module.RUNNER_CONNECT_S = 2.0
    backend = ContainerBackend.from_settings(make_settings(tmp_path, warm_pool_size=0))
    await backend.start()
    try:
        limits = Limits(timeout_s=DEFAULT_CALL_S)
        inv = Invocation(tool="shell", client="c", workspace=workspace(tmp_path, "w"),
                         plan=ExecutionPlan(kind=ToolKind.command, limits=limits,
                                            command=Plan.single(["true"]), image=tag))
        res = await backend.run(with_limits(inv, limits), time.monotonic() + DEFAULT_CALL_S)
        assert res.status is Status.error, res
        assert res.message and "runner" in res.message
        assert res.cleanup.verified
        assert labelled(docker_client, backend.config.instance_name) == []
    finally:
        calls_module.RUNNER_CONNECT_S = old
        await backend.close()
        docker_client.images.remove(tag, force=True)
