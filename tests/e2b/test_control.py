"""E2B's control plane through the official SDK (``e2b.Sandbox``): create, list with a
metadata filter, info, connect, set_timeout, kill; two clients' keys never see or reach
each other's sandboxes; what is not served says so by name."""

from __future__ import annotations

import pytest

from tests.e2b.conftest import E2bDaemon
from tests.support.wait import wait_until

pytestmark = pytest.mark.docker


def test_create_list_info_and_kill(e2b_env: E2bDaemon) -> None:
    from e2b import Sandbox, SandboxQuery

    sbx = Sandbox.create(template="base", metadata={"purpose": "listing"})
    other = Sandbox.create(template="base", metadata={"purpose": "else"})
    try:
        listed = Sandbox.list(query=SandboxQuery(metadata={"purpose": "listing"})).next_items()
        assert [s.sandbox_id for s in listed] == [sbx.sandbox_id]
        info = sbx.get_info()
        assert info.metadata == {"purpose": "listing"} and info.template_id == "base"
        assert sbx.sandbox_id.startswith("ses_")  # a session id: it names its node
        assert sbx.is_running()
    finally:
        assert sbx.kill()
        other.kill()
    assert not Sandbox.kill(sbx.sandbox_id)  # gone: the SDK's "not found" is False
    assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]


def test_set_timeout_expiry_ends_the_sandbox_and_its_container(e2b_env: E2bDaemon,
                                                                docker_client: object) -> None:
    from e2b_code_interpreter import Sandbox

    sbx = Sandbox.create()
    sbx.run_code("started = True")  # its kernel's container runs now

    def containers() -> list[object]:
        # filtered by the engine: the SDK's list inspects each container it lists, and one
        # another test removes meanwhile is a 404 unless skipped
        return docker_client.containers.list(  # type: ignore[attr-defined,no-any-return]
            ignore_removed=True, filters={"label": f"sandboxd.session={sbx.sandbox_id}"})

    assert containers()
    sbx.set_timeout(1)
    wait_until(lambda: not sbx.is_running(), timeout=60, what="the sandbox to expire")
    wait_until(lambda: not containers(), timeout=60, what="its container to be removed")


def test_two_keys_never_see_or_reach_each_others_sandboxes(e2b_env: E2bDaemon) -> None:
    import httpx
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    alice = Sandbox.create(template="base")
    bob_key = e2b_env.tokens["bob"]
    try:
        assert alice.sandbox_id not in [
            s.sandbox_id for s in Sandbox.list(api_key=bob_key).next_items()]
        with pytest.raises(SandboxException):
            Sandbox.connect(alice.sandbox_id, api_key=bob_key)
        assert not Sandbox.kill(alice.sandbox_id, api_key=bob_key)
        # the sandbox plane, its headers forged with alice's id and bob's key
        forged = {"E2b-Sandbox-Id": alice.sandbox_id, "E2b-Sandbox-Port": "49983",
                  "X-Access-Token": bob_key}
        url = e2b_env.daemon.url
        for method, path, body in (
                ("POST", "/process.Process/List", {}),
                ("POST", "/filesystem.Filesystem/ListDir", {"path": "/home/user"}),
                ("POST", "/execute", {"code": "1"}), ("GET", "/contexts", None)):
            answer = httpx.request(method, url + path, json=body, headers=forged)
            assert answer.status_code == 404, (path, answer.text)
        assert alice.is_running()
    finally:
        alice.kill()


def test_what_is_not_served_names_the_feature(e2b_env: E2bDaemon) -> None:
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    sbx = Sandbox.create(template="base")
    try:
        with pytest.raises(SandboxException, match="metrics") as raised:
            sbx.get_metrics()
        assert "not found" not in str(raised.value).lower()
    finally:
        sbx.kill()
    with pytest.raises(SandboxException, match="template 'no-such-template'"):
        Sandbox.create(template="no-such-template")


def test_bad_requests_and_unserved_envd_methods_say_what_is_wrong(e2b_env: E2bDaemon) -> None:
    import httpx

    key = {"X-API-Key": e2b_env.tokens["alice"]}
    with httpx.Client(base_url=e2b_env.daemon.url, headers=key, timeout=60) as http:
        bad = http.post("/v2/sandboxes", content=b"{not json")
        assert bad.status_code == 400 and "not JSON" in bad.json()["message"]
        made = http.post("/v2/sandboxes", json={"templateID": "base"})
        assert made.status_code == 201, made.text
        sid = made.json()["sandboxID"]
        plane = {"E2b-Sandbox-Id": sid, "X-Access-Token": made.json()["envdAccessToken"]}
        stdin = http.post("/process.Process/StreamInput", json={}, headers=plane)
        assert stdin.status_code == 501
        assert stdin.json() == {"code": "unimplemented",
                                "message": "sandboxd does not serve envd's process.StreamInput"}
        watch = http.post("/filesystem.Filesystem/WatchDir", json={"path": "/home/user"},
                          headers=plane)
        assert watch.status_code == 501 and "WatchDir" in watch.json()["message"]
        outside = http.post("/filesystem.Filesystem/ListDir", json={"path": "/etc"},
                            headers=plane)
        assert outside.status_code == 403 and "outside" in outside.json()["message"]
        assert http.delete(f"/sandboxes/{sid}").status_code == 204
        assert http.get("/health", headers=plane).status_code == 502  # gone: not running
    unauthenticated = httpx.get(f"{e2b_env.daemon.url}/v2/sandboxes",
                                headers={"X-API-Key": "sbx_not-a-token"})
    assert unauthenticated.status_code == 401
