"""A stopping Docker engine, as the container backend sees it (against a scripted engine,
:mod:`tests.support.scripted_engine`): the engine closes its listener, then stops its
containers, and answers on the connections it had until it exits. A runner lost then is
the engine's doing, and the backend must say so (a call's result names the engine); an
engine that answers a new connection again is no longer held as failing, and removals a
failure left are made again. tests/faults/test_docker.py stops a real engine under calls."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sandboxd.backends.container import engine
from sandboxd.backends.container.backend import ContainerBackend
from sandboxd.backends.container.boxes import Box
from sandboxd.backends.container.config import ContainerConfig
from sandboxd.backends.container.dockerapi import Engine
from sandboxd.models import Limits
from tests.support.scripted_engine import ScriptedEngine, stop_listening


def _backend(tmp_path: Path, srv: ScriptedEngine) -> ContainerBackend:
    url = f"unix://{srv.server_address}"
    config = ContainerConfig(state_dir=tmp_path / "state", instance_name="stopping",
                             python_image="p", shell_image="s", docker_url=url)
    backend = ContainerBackend(config)
    backend.boxes.engine_client = Engine(url)
    return backend


class _Endpoint:
    async def close(self) -> None:
        pass


def _box(cid: str) -> Box:
    return Box(name=f"box-{cid}", image="s", shape=engine.Shape.of(Limits()),
               endpoint=_Endpoint(), role="oneshot", cid=cid)  # type: ignore[arg-type]


async def test_a_runner_lost_to_a_stopping_engine_is_the_engines_failure(
        tmp_path: Path, server: ScriptedEngine) -> None:
    backend = _backend(tmp_path, server)
    boxes = backend.boxes
    try:
        await boxes.engine(boxes.client.ping)  # a kept connection, as calls leave them
        await boxes.check_engine_after_lost_runner()
        assert boxes.engine_error is None  # the engine answers anew: the runner's own story
        stop_listening(server)
        await boxes.engine(boxes.client.ping)  # still answered on the kept connection
        await boxes.check_engine_after_lost_runner()
        assert boxes.engine_error is not None and "did not answer" in boxes.engine_error
        assert boxes.engine_failures == 1
    finally:
        boxes.client.close()
        boxes.end_executor()


async def test_an_engine_answering_anew_is_no_longer_held_failing(
        tmp_path: Path, server: ScriptedEngine) -> None:
    removed: set[str] = set()

    def answer(method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        cid = path.split("?")[0].split("/")[2] if path.startswith("/containers/") else ""
        if method == "DELETE":
            removed.add(cid)
        if method == "GET" and cid:
            if cid in removed:
                return 404, "application/json", b'{"message": "No such container"}'
            return 200, "application/json", b'{"State": {"Running": false}}'
        return 200, "text/plain", b"OK"

    server.answer = answer
    backend = _backend(tmp_path, server)
    boxes = backend.boxes
    try:
        boxes.engine_failed(OSError("a call saw the engine fail"))
        left = _box("c1")
        boxes.stale.add(left)
        await backend._ping()
        assert boxes.engine_error is None
        await boxes.wait_removals()
        assert removed == {"c1"} and not boxes.stale  # its removal made again, and confirmed

        # a failure seen while a ping was under way is not forgotten by that ping
        def fails_during_the_ping(method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
            if path == "/_ping":
                boxes.engine_failures += 1  # what engine_failed does, seen from a call
            return answer(method, path, body)

        server.answer = fails_during_the_ping
        boxes.engine_error = "the engine did not answer a call"
        await backend._ping()
        assert boxes.engine_error == "the engine did not answer a call"
        server.answer = answer
        await backend._ping()
        assert boxes.engine_error is None
    finally:
        boxes.client.close()
        if backend._ping_client is not None:
            backend._ping_client.close()
        boxes.end_executor()
        await asyncio.sleep(0)
