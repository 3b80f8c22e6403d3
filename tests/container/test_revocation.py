"""Revocation on the container backend (a revoked client must keep nothing running): removing a
client's last token with ``sandboxd token remove`` ends its session container (and the kernel in it)
and its workspace, audited as ``client_revoked``; another client's session container stays."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandboxd.access.tokens import add_token
from tests.auth.test_revocation import mounted, revoked, token_cli
from tests.support.daemon import running_daemon

from .conftest import labelled
from .test_http import POLICY, daemon_env

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = pytest.mark.same_on_every_host(
    "revocation is the token store and the daemon's close of the client's sessions; that a "
    "close removes a session's container and the kernel in it is proven in the VM by "
    "test_sessions' close test and test_kernel's no-process-outlives test")


def test_token_remove_ends_the_session_container(docker_client: Any, tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "containers.yaml").write_text(POLICY)
    tokens = tmp_path / "tokens.yaml"
    alice = add_token(tokens, "alice")
    bob = add_token(tokens, "bob")
    instance = f"rev{secrets.token_hex(4)}"
    env = daemon_env(instance) | {"SANDBOXD_TOKENS_FILE": str(tokens)}

    def sessions() -> set[str]:
        return {c.labels.get("sandboxd.session") for c in labelled(docker_client, instance)}

    with running_daemon(tmp_path, policies_dir=policies, env=env, token=alice) as d, \
            httpx.Client(base_url=d.url, headers={"Authorization": f"Bearer {bob}"},
                         timeout=120.0) as bob_http:
        sid = d.client.post("/v1/sessions").json()["id"]
        r = d.invoke("python", {"code": "x = 41\nopen('notes.txt', 'w').write('kept')"},
                     session=sid)
        assert r.status_code == 200 and r.json()["status"] == "ok", r.text
        bob_sid = bob_http.post("/v1/sessions").json()["id"]
        r = bob_http.post("/v1/tools/python/invoke",
                          json={"session": bob_sid, "arguments": {"code": "y = 1"}})
        assert r.status_code == 200 and r.json()["status"] == "ok", r.text
        assert {sid, bob_sid} <= sessions()
        workspace = d.state_dir / "workspaces" / sid
        assert (workspace / "notes.txt").exists()

        token_cli("remove", "alice", "--tokens-file", str(tokens))

        record = revoked(d, "alice")
        assert [s["id"] for s in record["sessions"]] == [sid]
        assert record["sessions"][0]["kernels"] == ["container"] and record["verified"]
        current = sessions()
        assert sid not in current and bob_sid in current
        assert not workspace.exists() and not mounted(workspace)
        r = bob_http.post("/v1/tools/python/invoke",
                          json={"session": bob_sid, "arguments": {"code": "y"}})
        assert r.status_code == 200 and r.json()["value"] == 1, r.text
