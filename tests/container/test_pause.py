"""Idle pause (an idle session holds no CPU), through the real daemon: a session container idle for
``session_pause_after_s`` is paused by the engine (``State.Paused``), ``GET
/v1/sessions/{id}`` says ``paused``, and its next call thaws it with its kernel's variables;
a paused session can be closed and leaves no container; the warm pool and a busy session are
never paused; calls that race with the pauses get their own results."""

from __future__ import annotations

import secrets
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.wait import wait_until

from .conftest import labelled
from .test_http import POLICY, daemon_env

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, str]]:
    """One daemon whose idle session containers are paused after 1 s; its instance label."""
    tmp = tmp_path_factory.mktemp("pause")
    policies = tmp / "policies"
    policies.mkdir()
    (policies / "containers.yaml").write_text(
        POLICY + '  write_file: {paths: {allow: ["**"]}, max_bytes: 1Mi}\n'
        '  read_file: {paths: {allow: ["**"]}, max_bytes: 1Mi}\n')
    short = Path(tempfile.mkdtemp(prefix="sbx-"))  # a runner socket path fits in 108 bytes
    instance = f"pause{secrets.token_hex(4)}"
    env = {**daemon_env(instance), "SANDBOXD_SESSION_PAUSE_AFTER_S": "1"}
    try:
        with running_daemon(tmp, policies_dir=policies, env=env,
                            state_dir=short / "state") as d:
            yield d, instance
    finally:
        shutil.rmtree(short, ignore_errors=True)


def _containers(docker_client: Any, instance: str, session: str) -> list[Any]:
    return [c for c in labelled(docker_client, instance)
            if c.labels.get("sandboxd.session") == session]


def _state(docker_client: Any, instance: str, session: str) -> dict[str, Any]:
    """The engine's ``State`` of the session's one container."""
    found = _containers(docker_client, instance, session)
    assert len(found) == 1, found
    found[0].reload()
    state: dict[str, Any] = found[0].attrs["State"]
    return {**state, "Id": found[0].id}


def _python(d: RunningDaemon, sid: str, code: str) -> dict[str, Any]:
    r = d.invoke("python", {"code": code}, session=sid)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _paused(d: RunningDaemon, docker_client: Any, instance: str, sid: str) -> bool:
    """The engine has paused the session's container and the session view says so."""
    return bool(_state(docker_client, instance, sid)["Paused"]) and \
        d.client.get(f"/v1/sessions/{sid}").json()["paused"] is True


def test_an_idle_session_is_paused_and_its_next_call_thaws_it(
        daemon: tuple[RunningDaemon, str], docker_client: Any) -> None:
    d, instance = daemon
    sid = d.client.post("/v1/sessions").json()["id"]
    busy = d.client.post("/v1/sessions").json()["id"]
    assert d.client.get(f"/v1/sessions/{sid}").json()["paused"] is False
    # another session runs one call all along (until the test drops a file in its workspace)
    assert _python(d, busy, "import os")["status"] == "ok"
    answer: dict[str, Any] = {}

    def long_call() -> None:
        with httpx.Client(base_url=d.url, headers=d.client.headers, timeout=120) as c:
            answer.update(c.post("/v1/tools/python/invoke", json={
                "session": busy, "arguments": {"code": (
                    "import os, time\nopen('started', 'w').close()\n"
                    "while not os.path.exists('go'):\n    time.sleep(0.02)\n"
                    "'busy done'")}}).json())

    worker = threading.Thread(target=long_call)
    worker.start()
    try:
        # the call runs (its code wrote the file); only then does the idle session's idle
        # spell begin, so the busy one has had a call running for longer than the pause delay
        wait_until(lambda: d.client.get(f"/v1/sessions/{busy}/files/started").status_code
                   == 200, timeout=60, what="the busy session's call to start",
                   detail=lambda: answer)
        assert _python(d, sid, "x = 41")["status"] == "ok"
        wait_until(lambda: _paused(d, docker_client, instance, sid), timeout=60,
                   what="the idle session's container to be paused",
                   detail=lambda: _state(docker_client, instance, sid))
        # the session with a call running is not paused, nor is the warm pool
        assert not _state(docker_client, instance, busy)["Paused"]
        assert d.client.get(f"/v1/sessions/{busy}").json()["paused"] is False
        pool = [c for c in labelled(docker_client, instance)
                if c.labels.get("sandboxd.role") == "pool"]
        assert pool and not any(c.attrs["State"]["Paused"] for c in pool), pool
        # the session list shows it too
        listed = {s["id"]: s["paused"] for s in d.client.get("/v1/sessions").json()}
        assert listed[sid] is True and listed[busy] is False, listed
    finally:
        put = d.client.put(f"/v1/sessions/{busy}/files/go", content=b"")
        assert put.status_code in (200, 201, 204), put.text
        worker.join(120)
    assert answer.get("value") == "busy done", answer
    paused_id = _state(docker_client, instance, sid)["Id"]
    body = _python(d, sid, "x + 1")
    assert body["status"] == "ok" and body["value"] == 42, body
    assert body["kernel"]["calls"] == 2 and not body["kernel"]["lost"], body
    state = _state(docker_client, instance, sid)
    assert state["Id"] == paused_id and state["Running"] and not state["Paused"], state
    assert d.client.get(f"/v1/sessions/{sid}").json()["paused"] is False
    for s in (sid, busy):
        assert d.client.delete(f"/v1/sessions/{s}").status_code == 204


def test_a_paused_session_is_closed_and_leaves_no_container(
        daemon: tuple[RunningDaemon, str], docker_client: Any) -> None:
    d, instance = daemon
    sid = d.client.post("/v1/sessions").json()["id"]
    assert _python(d, sid, "x = 1")["status"] == "ok"
    wait_until(lambda: _paused(d, docker_client, instance, sid), timeout=60,
               what="the idle session's container to be paused")
    assert d.client.delete(f"/v1/sessions/{sid}").status_code == 204
    assert _containers(docker_client, instance, sid) == []
    assert d.client.get(f"/v1/sessions/{sid}").status_code == 404


def test_every_call_after_a_pause_sees_the_kernel(
        daemon: tuple[RunningDaemon, str], docker_client: Any) -> None:
    """Paused, thawed, paused again: the kernel's state survives each round (a call that
    starts while its container is being paused: tests/container/test_pause_race.py)."""
    d, instance = daemon
    sid = d.client.post("/v1/sessions").json()["id"]
    assert _python(d, sid, "x = 0")["status"] == "ok"
    for i in range(1, 4):
        wait_until(lambda: _paused(d, docker_client, instance, sid), timeout=60,
                   what="the idle session's container to be paused")
        body = _python(d, sid, "x += 1\nx")
        assert body["status"] == "ok" and body["value"] == i, body
        assert not _state(docker_client, instance, sid)["Paused"]
    assert d.client.delete(f"/v1/sessions/{sid}").status_code == 204
