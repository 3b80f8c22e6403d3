"""Idle pause against a call, through the container backend on a real engine: a call that starts
while its session container is being paused waits for the pause, thaws it and gets its result; a
thaw the engine refuses ends that call with a clear error and a removed container (never a
hang); a kernel restart thaws a paused container first."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from sandboxd.backends.container import ContainerBackend, engine
from sandboxd.backends.container.dockerapi import APIError
from sandboxd.models import Status
from tests.support.wait import async_wait_until

from .conftest import labelled, make_settings, run, workspace

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def backend(docker_client: Any, tmp_path_factory: pytest.TempPathFactory,
                  ) -> AsyncIterator[ContainerBackend]:
    """A started backend that pauses session containers idle for 0.3 s."""
    b = ContainerBackend.from_settings(make_settings(tmp_path_factory.mktemp("pause"),
                                                     session_pause_after_s=0.3))
    await b.start()
    ok, why = b.availability()
    assert ok, why
    yield b
    await b.close()
    assert labelled(docker_client, b.config.instance_name) == []


def _state(docker_client: Any, backend: ContainerBackend, session: str) -> dict[str, Any]:
    found = [c for c in labelled(docker_client, backend.config.instance_name)
             if c.labels.get("sandboxd.session") == session]
    assert len(found) == 1, found
    state: dict[str, Any] = found[0].attrs["State"]
    return state


async def test_a_call_that_starts_during_a_pause_waits_then_thaws(
        backend: ContainerBackend, tmp_path: Path, docker_client: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ws = workspace(tmp_path, "r1")
    events: list[str] = []
    in_flight, go = threading.Event(), threading.Event()
    real_pause, real_unpause = engine.pause, engine.unpause

    def gated_pause(client: Any, cid: str) -> None:  # the engine is slow to pause
        in_flight.set()
        go.wait(60)
        real_pause(client, cid)
        events.append("pause")

    def unpause(client: Any, cid: str) -> None:
        real_unpause(client, cid)
        events.append("unpause")

    monkeypatch.setattr(engine, "pause", gated_pause)
    monkeypatch.setattr(engine, "unpause", unpause)
    assert (await run(backend, ws, session="r1", code="x = 41")).status is Status.ok
    await async_wait_until(in_flight.is_set, timeout=30, what="a pause in flight")
    call = asyncio.create_task(run(backend, ws, session="r1", code="x + 1"))
    await async_wait_until(lambda: any(k[1] == "r1" for k in backend.sessions.idle._busy),
                           timeout=30, what="the call to start")
    go.set()  # the pause ends now, after the call started
    res = await call
    assert res.status is Status.ok and res.value == 42, res
    assert events[:2] == ["pause", "unpause"], events  # (a later idle spell may pause again)
    await backend.close_session("r1")


async def test_a_thaw_the_engine_refuses_ends_the_call_clearly(
        backend: ContainerBackend, tmp_path: Path, docker_client: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ws = workspace(tmp_path, "r2")
    assert (await run(backend, ws, session="r2", code="x = 41")).status is Status.ok
    await async_wait_until(lambda: backend.paused_sessions() == {"r2"}, timeout=30,
                           what="the session container to be paused")
    assert _state(docker_client, backend, "r2")["Paused"]

    def refuse(client: Any, cid: str) -> None:
        raise APIError(409, "the engine says no", f"POST /containers/{cid}/unpause")

    monkeypatch.setattr(engine, "unpause", refuse)
    res = await run(backend, ws, session="r2", code="x + 1")
    assert res.status is Status.error and res.message is not None, res
    assert "could not be resumed: the engine says no" in res.message, res.message
    assert res.kernel is not None and res.kernel.lost and res.kernel.reason == "thaw_failed"
    assert res.cleanup.verified, res.cleanup  # the paused container is removed
    assert [c for c in labelled(docker_client, backend.config.instance_name)
            if c.labels.get("sandboxd.session") == "r2"] == []
    assert backend.paused_sessions() == set()
    monkeypatch.undo()
    res = await run(backend, ws, session="r2", code="'x' in globals()")
    assert res.status is Status.ok and res.value is False, res  # a fresh container and kernel
    await backend.close_session("r2")


async def test_a_kernel_restart_thaws_the_paused_container(
        backend: ContainerBackend, tmp_path: Path, docker_client: Any) -> None:
    ws = workspace(tmp_path, "r3")
    assert (await run(backend, ws, session="r3", code="x = 41")).status is Status.ok
    await async_wait_until(lambda: backend.paused_sessions() == {"r3"}, timeout=30,
                           what="the session container to be paused")
    paused = backend.sessions.by_key[("tester", "r3", backend.config.python_image)]
    assert await backend.restart_kernel("r3") is True
    # its runner answered (a frozen one cannot: its container would have been removed)
    assert backend.sessions.by_key.get(("tester", "r3", backend.config.python_image)) is paused
    assert not paused.dead and _state(docker_client, backend, "r3")["Running"]
    res = await run(backend, ws, session="r3", code="'x' in globals()")
    assert res.status is Status.ok and res.value is False and res.kernel is not None
    assert res.kernel.fresh, res
    await backend.close_session("r3")
