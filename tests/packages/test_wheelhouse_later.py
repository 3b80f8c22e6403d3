"""``install_packages`` where the admin's wheelhouse appears after a session was made: the
call says why it cannot install there and what to do (a new session), never a bare error.
Through the real daemon and a real Docker engine."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from sandboxd.access.tokens import add_token
from sandboxd.protocol.packages import WHEELHOUSE_CAME_LATER
from tests.container.conftest import labelled
from tests.container.test_http import daemon_env
from tests.packages.test_install_packages import POLICY
from tests.support.daemon import running_daemon
from tests.support.wheels import make_pip_wheel, make_wheel


def test_a_session_made_before_the_wheelhouse_existed_is_told_to_use_a_new_one(
        docker_client: Any, tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheelhouse"  # set, but not made yet
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "packages.yaml").write_text(POLICY)
    instance = f"late{secrets.token_hex(4)}"
    tokens = tmp_path / "tokens.yaml"
    key = add_token(tokens, "alice")
    env = {**daemon_env(instance), "SANDBOXD_TOKENS_FILE": str(tokens),
           "SANDBOXD_WHEELHOUSE": str(wheelhouse)}
    with running_daemon(tmp_path, policies_dir=policies, env=env, token=key) as d:
        def session() -> str:
            r = d.client.post("/v1/sessions")
            assert r.status_code in (200, 201), r.text
            return str(r.json()["id"])

        def call(tool: str, arguments: dict[str, Any], s: str) -> dict[str, Any]:
            r = d.client.post(f"/v1/tools/{tool}/invoke",
                              json={"arguments": arguments, "session": s})
            assert r.status_code == 200, r.text
            return dict(r.json())

        early = session()
        assert call("python", {"code": "x = 1"}, early)["status"] == "ok"  # its container
        res = call("install_packages", {"packages": ["tiny-pkg"]}, early)
        assert res["status"] == "denied", res
        assert "wheelhouse does not exist" in res["message"], res
        # the admin makes the wheelhouse now
        wheelhouse.mkdir()
        wheelhouse.chmod(0o755)
        make_pip_wheel(wheelhouse)
        make_wheel(wheelhouse, "tiny-pkg", "1.0", {"tinypkg/__init__.py": "ANSWER = 42\n"})
        res = call("install_packages", {"packages": ["tiny-pkg"]}, early)
        assert res["status"] == "error" and res["message"] == WHEELHOUSE_CAME_LATER, res
        assert call("python", {"code": "x"}, early)["value"] == 1  # the session is intact
        fresh = session()
        res = call("install_packages", {"packages": ["tiny-pkg"]}, fresh)
        assert res["status"] == "ok", res
        res = call("python", {"code": "import tinypkg\ntinypkg.ANSWER"}, fresh)
        assert res["value"] == 42, res
    assert labelled(docker_client, instance) == []
