"""E2B's pause and resume through the official SDK, onto the container backend's idle pause:
``pause()`` freezes the sandbox's container now (the engine says ``State.Paused``), info and
list say ``paused``, ``connect`` thaws it with its kernel's variables, and so does any later
call; another key can neither pause nor resume it; both are audited."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2b.conftest import E2bDaemon
from tests.support.audit import audit_records
from tests.support.daemon import running_daemon

pytestmark = pytest.mark.docker


def _paused(docker_client: Any, sandbox_id: str) -> bool:
    """Whether the engine says the sandbox's one container is paused (seen from outside)."""
    # filtered by the engine, and a container another test removes meanwhile skipped
    boxes = docker_client.containers.list(all=True, ignore_removed=True,
                                          filters={"label": f"sandboxd.session={sandbox_id}"})
    assert len(boxes) == 1, boxes
    boxes[0].reload()
    return bool(boxes[0].attrs["State"]["Paused"])


def test_pause_then_connect_keeps_the_kernels_state(e2b_env: E2bDaemon,
                                                     docker_client: Any) -> None:
    from e2b import SandboxQuery, SandboxState
    from e2b.exceptions import SandboxException
    from e2b_code_interpreter import Sandbox

    sbx = Sandbox.create()
    bob_key = e2b_env.tokens["bob"]
    try:
        assert sbx.run_code("x = 41").error is None
        assert not _paused(docker_client, sbx.sandbox_id)

        assert sbx.pause() is True
        assert _paused(docker_client, sbx.sandbox_id)
        assert sbx.get_info().state == SandboxState.PAUSED
        listed = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        assert sbx.sandbox_id in [s.sandbox_id for s in listed]
        running = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING])).next_items()
        assert sbx.sandbox_id not in [s.sandbox_id for s in running]
        assert sbx.pause() is False  # paused already: the SDK's answer to a 409

        # another key finds no such sandbox: it can neither resume nor pause it
        with pytest.raises(SandboxException):
            Sandbox.connect(sbx.sandbox_id, api_key=bob_key)
        assert _paused(docker_client, sbx.sandbox_id)

        again = Sandbox.connect(sbx.sandbox_id)
        assert not _paused(docker_client, sbx.sandbox_id)
        assert again.get_info().state == SandboxState.RUNNING
        assert again.run_code("x + 1").text == "42"

        with pytest.raises(SandboxException):
            Sandbox.pause(sbx.sandbox_id, api_key=bob_key)
        assert not _paused(docker_client, sbx.sandbox_id)

        # a call thaws a paused sandbox too (as it thaws an idle one)
        assert sbx.pause() is True and _paused(docker_client, sbx.sandbox_id)
        assert sbx.run_code("x += 1; x").text == "42"
        assert not _paused(docker_client, sbx.sandbox_id)
    finally:
        sbx.kill()
    records = [(r["event"], r["client"], r.get("transport"))
               for r in audit_records(e2b_env.daemon.audit_path)
               if r.get("session") == sbx.sandbox_id
               and r["event"] in ("session_paused", "session_resumed")]
    assert records == [("session_paused", "alice", "e2b"), ("session_resumed", "alice", "e2b"),
                       ("session_paused", "alice", "e2b")]


def test_a_sandbox_with_no_container_yet_says_why_it_cannot_pause(e2b_env: E2bDaemon) -> None:
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    sbx = Sandbox.create(template="base")
    try:
        with pytest.raises(SandboxException, match="no container to pause now"):
            sbx.pause()
        assert sbx.is_running()
    finally:
        sbx.kill()


def test_a_restricted_backend_sandbox_says_why_it_cannot_pause(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped default policy runs ``python`` on the restricted backend: its kernel is a
    confined worker process, no container; the pause says so, and the kernel is unharmed."""
    from e2b.exceptions import SandboxException
    from e2b_code_interpreter import Sandbox

    with running_daemon(tmp_path) as daemon:
        for key, value in {"E2B_API_URL": daemon.url, "E2B_SANDBOX_URL": daemon.url,
                           "E2B_API_KEY": "unused", "E2B_DOMAIN": "sandboxd.invalid"}.items():
            monkeypatch.setenv(key, value)
        sbx = Sandbox.create()
        try:
            assert sbx.run_code("x = 41").error is None
            with pytest.raises(SandboxException,
                               match="restricted backend, which has no container to pause"):
                sbx.pause()
            assert sbx.run_code("x + 1").text == "42"
        finally:
            sbx.kill()
        audited = [r for r in audit_records(daemon.audit_path, "session_paused")
                   if r["session"] == sbx.sandbox_id]
        assert [r["backends"] for r in audited] == [[]]
