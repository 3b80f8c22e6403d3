"""Container backend: the session kernel's lifecycle through the backend's own API
(``restart_kernel``, ``kernel_sessions``, ``close_session``, ``close``) on a real Docker
engine. The HTTP route that restarts a kernel is the service's; these are what it calls."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends.container import ContainerBackend
from sandboxd.models import Status
from tests.support.wait import async_wait_until

from .conftest import make_settings, run, workspace
from .test_kernel import LIST_PROCS
from .test_sessions import session_containers

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.same_on_every_host(
    "a kernel's restart and close through the backend's API: the runner ends a process in its "
    "container, the same on any host; the removal of a session's containers at its close and "
    "a kernel's end at its limits are test_sessions' and test_kernel's in the VM")]


def kernels_in(docker_client: Any, backend: ContainerBackend, session: str) -> int:
    """Processes of the session's container(s) that are a kernel: a runner's forked child."""
    count = 0
    for c in session_containers(docker_client, backend, session):
        if c.status != "running":
            continue
        top = c.top(ps_args="-o pid,ppid,args")
        rows = [dict(zip(top["Titles"], p, strict=False)) for p in top["Processes"]]
        runners = {r["PID"] for r in rows if "runner.py" in r.get("COMMAND", "")
                   and not r.get("COMMAND", "").startswith("/sbin")}
        count += sum(1 for r in rows if r["PPID"] in runners)
    return count


async def test_restart_ends_the_kernel_and_keeps_the_container(
        backend: ContainerBackend, tmp_path: Path, docker_client: Any) -> None:
    ws = workspace(tmp_path, "k1")
    assert backend.kernel_sessions() == set()
    assert await backend.restart_kernel("k1") is False  # no kernel yet: nothing to end
    res = await run(backend, ws, session="k1", code="x = 41\nopen('f.txt', 'w').write('kept')")
    assert res.status is Status.ok and res.kernel is not None and res.kernel.fresh, res
    assert backend.kernel_sessions() == {"k1"}
    assert kernels_in(docker_client, backend, "k1") == 1
    box = {c.id for c in session_containers(docker_client, backend, "k1")}
    assert await backend.restart_kernel("k1") is True
    assert backend.kernel_sessions() == set()
    assert kernels_in(docker_client, backend, "k1") == 0  # the kernel process is gone
    assert await backend.restart_kernel("k1") is False  # idempotent
    res = await run(backend, ws, session="k1", code="[open('f.txt').read(), 'x' in globals()]")
    assert res.value == ["kept", False], res
    assert res.kernel is not None and res.kernel.fresh and res.kernel.calls == 1
    assert {c.id for c in session_containers(docker_client, backend, "k1")} == box
    await backend.close_session("k1")
    assert backend.kernel_sessions() == set()
    assert session_containers(docker_client, backend, "k1") == []


async def test_restart_during_a_call_ends_that_call_as_restarted(
        backend: ContainerBackend, tmp_path: Path) -> None:
    ws = workspace(tmp_path, "k2")
    assert (await run(backend, ws, session="k2", code="x = 1")).status is Status.ok
    call = asyncio.create_task(run(backend, ws, session="k2",
                                   code="import time\ntime.sleep(30)"))

    def sent() -> bool:  # the call is on the session container's runner channel
        return any(key[1] == "k2" and box.endpoint.channel is not None
                   and bool(box.endpoint.channel.calls)
                   for key, box in backend.sessions.by_key.items())

    await async_wait_until(sent, timeout=30, what="the call to reach the session's runner")
    assert await backend.restart_kernel("k2") is True
    res = await call
    assert res.kernel is not None and res.kernel.lost and res.kernel.reason == "restarted", res
    assert res.resources.wall_ms < 20_000, res
    res = await run(backend, ws, session="k2", code="'x' in globals()")
    assert res.value is False and res.kernel is not None and res.kernel.fresh, res
    await backend.close_session("k2")


async def test_kernels_are_per_session_and_one_shot_calls_have_none(
        backend: ContainerBackend, tmp_path: Path, docker_client: Any) -> None:
    wa, wb = workspace(tmp_path, "ka"), workspace(tmp_path, "kb")
    await run(backend, wa, session="ka", code="a = 1")
    await run(backend, wb, session="kb", code="b = 2")
    assert backend.kernel_sessions() == {"ka", "kb"}
    res = await run(backend, wa, session="ka", code="[a, 'b' in globals()]")
    assert res.value == [1, False], res
    res = await run(backend, wa, code="'a' in globals()")
    assert res.value is False and res.kernel is None, res
    # a session's shell calls run beside its kernel and leave it alone
    res = await run(backend, wa, session="ka", argv=["echo", "hi"])
    assert res.stdout == "hi\n" and res.kernel is None, res
    assert (await run(backend, wa, session="ka", code="a")).value == 1
    res = await run(backend, wa, session="ka", code=LIST_PROCS)
    assert len(res.value) == 3, res.value  # init, runner, kernel: nothing else
    await backend.close_session("ka")
    assert backend.kernel_sessions() == {"kb"}
    await backend.close_session("kb")
    assert backend.kernel_sessions() == set()


async def test_close_ends_every_kernel(docker_client: Any, tmp_path: Path) -> None:
    b = ContainerBackend.from_settings(make_settings(tmp_path, warm_pool_size=0))
    await b.start()
    ok, why = b.availability()
    assert ok, why
    ws = workspace(tmp_path, "kc")
    res = await run(b, ws, session="kc", code="x = 1")
    assert res.kernel is not None and res.kernel.fresh, res
    assert b.kernel_sessions() == {"kc"}
    await b.close()
    assert b.kernel_sessions() == set()
    assert docker_client.containers.list(all=True, filters={
        "label": f"sandboxd.daemon={b.config.instance_name}"}) == []


async def test_a_shell_call_that_removes_the_container_reports_the_kernel_lost(
        backend: ContainerBackend, tmp_path: Path) -> None:
    ws = workspace(tmp_path, "kd")
    assert (await run(backend, ws, session="kd", code="x = 1")).status is Status.ok
    res = await run(backend, ws, session="kd", argv=["sleep", "100"], timeout=1)
    assert res.status is Status.timeout, res
    assert res.kernel is not None and res.kernel.lost, res
    assert res.kernel.reason == "wall_timeout" and res.kernel.calls == 1, res
    assert backend.kernel_sessions() == set()
    res = await run(backend, ws, session="kd", code="'x' in globals()")
    assert res.value is False and res.kernel is not None and res.kernel.fresh, res
    await backend.close_session("kd")
