"""Session lifetime and quota through the real API."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.daemon import running_daemon


def test_session_expires_after_ttl_and_workspace_is_removed(tmp_path: Path) -> None:
    with running_daemon(tmp_path, env={"SANDBOXD_SESSION_TTL_S": "1"}) as d:
        sid = d.client.post("/v1/sessions").json()["id"]
        assert d.invoke("write_file", {"path": "f", "content": "x"}, session=sid).json()[
            "status"] == "ok"
        workspace = d.state_dir / "workspaces" / sid
        assert workspace.is_dir()
        deadline = time.monotonic() + 10
        while workspace.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not workspace.exists(), "expired session's workspace was not removed"
        assert d.client.get(f"/v1/sessions/{sid}").status_code == 404
        assert d.invoke("read_file", {"path": "f"}, session=sid).status_code == 404


def test_session_quota_is_enforced(tmp_path: Path) -> None:
    env = {"SANDBOXD_SESSION_QUOTA_BYTES": "10000"}
    with running_daemon(tmp_path, env=env) as d:
        sid = d.client.post("/v1/sessions").json()["id"]
        ok = d.invoke("write_file", {"path": "a", "content": "x" * 6000}, session=sid).json()
        assert ok["status"] == "ok"
        over = d.invoke("write_file", {"path": "b", "content": "y" * 6000}, session=sid).json()
        assert over["status"] == "error" and "quota" in over["message"]
        assert not (d.state_dir / "workspaces" / sid / "b").exists()


def test_session_limit_per_client(tmp_path: Path) -> None:
    with running_daemon(tmp_path, env={"SANDBOXD_MAX_SESSIONS_PER_CLIENT": "2"}) as d:
        assert d.client.post("/v1/sessions").status_code == 201
        assert d.client.post("/v1/sessions").status_code == 201
        third = d.client.post("/v1/sessions")
        assert third.status_code == 409
        assert "maximum" in third.json()["detail"]
