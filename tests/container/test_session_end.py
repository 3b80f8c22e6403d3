"""A session's end ends its calls on the container backend, through a real daemon and the real
Docker engine: a ``python`` call that waits for the session's kernel when the session is
deleted, or its client revoked, ends ``killed`` (``cancelled``) and never brings the session
back (no new container, no workspace made again, nothing running as its uid); the call that
was running in the kernel ends the same way and its container is gone."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from sandboxd.access.tokens import add_token
from tests.api.test_session_end import a_waiting_call, assert_ended
from tests.auth.test_revocation import revoked, token_cli
from tests.support.daemon import RunningDaemon, running_daemon

from .conftest import labelled
from .test_http import SLOW_ENGINE_POLICY, daemon_env

pytestmark = pytest.mark.same_on_every_host(
    "which calls a session's end cancels is the daemon's own logic (tests/api's scripted "
    "twin proves the same); the removal of a closed session's containers is test_sessions'")


def _daemon(tmp_path: Path, instance: str, env: dict[str, str] | None = None,
            token: str | None = None) -> Any:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "containers.yaml").write_text(SLOW_ENGINE_POLICY)
    return running_daemon(tmp_path, policies_dir=policies, token=token,
                          env=daemon_env(instance) | {"SANDBOXD_WARM_POOL_SIZE": "0"}
                          | (env or {}))


def _containers(docker_client: Any, instance: str, sid: str) -> list[Any]:
    return [c for c in labelled(docker_client, instance)
            if c.labels.get("sandboxd.session") == sid]


def _warm(d: RunningDaemon, sid: str) -> None:
    """The session's container and kernel, started (the engine's start is not the test)."""
    r = d.invoke("python", {"code": "x = 1"}, session=sid, limits={"timeout_s": 180})
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text


def test_delete_ends_the_waiting_call_without_a_new_container(docker_client: Any,
                                                             tmp_path: Path) -> None:
    instance = f"end{secrets.token_hex(4)}"
    with _daemon(tmp_path, instance) as d:
        sid = d.client.post("/v1/sessions").json()["id"]
        _warm(d, sid)
        running, queued, uid, workspace = a_waiting_call(d, sid)
        assert d.client.delete(f"/v1/sessions/{sid}").status_code == 204
        assert _containers(docker_client, instance, sid) == []
        assert_ended(d, [running, queued], uid, workspace)
        assert _containers(docker_client, instance, sid) == []  # none came back late


def test_revocation_ends_the_waiting_call_without_a_new_container(docker_client: Any,
                                                                 tmp_path: Path) -> None:
    instance = f"end{secrets.token_hex(4)}"
    tokens = tmp_path / "tokens.yaml"
    alice = add_token(tokens, "alice")
    with _daemon(tmp_path, instance, {"SANDBOXD_TOKENS_FILE": str(tokens)}, alice) as d:
        sid = d.client.post("/v1/sessions").json()["id"]
        _warm(d, sid)
        running, queued, uid, workspace = a_waiting_call(d, sid)
        token_cli("remove", "alice", "--tokens-file", str(tokens))
        record = revoked(d, "alice")
        assert [s["id"] for s in record["sessions"]] == [sid] and record["verified"]
        assert_ended(d, [running, queued], uid, workspace)
        assert _containers(docker_client, instance, sid) == []
