"""Revocation ends what it must (a revoked client must keep nothing running), through a real
daemon (restricted backend) and the real ``sandboxd token`` CLI on its tokens file: a client whose
last token is removed or expires loses its sessions, kernel processes, workspaces and MCP sessions
(audited as ``client_revoked``), and its kernel stops counting against ``max_kernels``; a rotated
token keeps everything; a tokens file that fails to parse revokes nobody."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from sandboxd.access.tokens import TokenStore, add_token, hash_token, iso
from tests.restricted.test_kernel import kernel_process
from tests.support import cli
from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.mcp_raw import RawMcp
from tests.support.processes import running
from tests.support.wait import wait_until


def token_cli(*args: str) -> str:
    """``sandboxd token ...`` as an administrator runs it (this checkout's code); its stdout."""
    env = {"PATH": "/usr/bin:/bin", "SANDBOXD_CONFIG": os.devnull,
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    r = cli.run("token", *args, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def http(d: RunningDaemon, token: str) -> httpx.Client:
    return httpx.Client(base_url=d.url, headers={"Authorization": f"Bearer {token}"},
                        timeout=120.0)


def session_with_kernel(client: httpx.Client, state_dir: Path) -> tuple[str, int, Path]:
    """A session whose kernel holds ``x = 41`` and whose workspace holds ``notes.txt``: its
    id, its kernel's pid and its workspace."""
    r = client.post("/v1/sessions", json={})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    r = client.post("/v1/tools/python/invoke", json={
        "session": sid, "arguments": {"code": "x = 41\nopen('notes.txt', 'w').write('kept')"}})
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text
    workspace = state_dir / "workspaces" / sid
    assert (workspace / "notes.txt").read_text() == "kept"
    return sid, kernel_process(workspace).pid, workspace


def mcp_session(d: RunningDaemon, token: str) -> tuple[dict[str, str], str]:
    """An MCP session (raw Streamable HTTP) that wrote a file: its request headers and its
    sandboxd session id."""
    mcp = RawMcp(d.url, {"Authorization": f"Bearer {token}"})
    answer = mcp.call("write_file", {"path": "m.txt", "content": "x"}, ident=2)
    mcp.http.close()  # the session stays open (close() would end it)
    return dict(mcp.headers), answer["result"]["structuredContent"]["session"]


def mcp_status(d: RunningDaemon, headers: dict[str, str]) -> int:
    return httpx.post(f"{d.url}/mcp", headers=headers, timeout=60, json={
        "jsonrpc": "2.0", "id": 3, "method": "tools/list"}).status_code


def revoked(d: RunningDaemon, client: str) -> dict[str, Any]:
    """Wait for the ``client_revoked`` record of ``client``."""
    def record() -> dict[str, Any] | None:
        found = [r for r in audit_records(d.audit_path, "client_revoked")
                 if r["client"] == client]
        return found[0] if found else None

    found = wait_until(record, timeout=60, interval=0.1, what=f"client {client} revoked",
                       detail=lambda: d.log()[-2000:])
    assert found is not None
    return found


def mounted(path: Path) -> bool:
    return any(line.split()[4] == str(path)
               for line in Path("/proc/self/mountinfo").read_text().splitlines())


def test_token_remove_ends_sessions_kernels_workspaces_and_mcp_sessions(
        tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    alice = add_token(tokens, "alice")
    bob = add_token(tokens, "bob")
    env = {"SANDBOXD_TOKENS_FILE": str(tokens), "SANDBOXD_MAX_KERNELS": "1",
           "SANDBOXD_CONTAINER_ENABLED": "false"}
    with running_daemon(tmp_path, env=env, token=alice) as d, http(d, bob) as bob_http:
        sid, pid, workspace = session_with_kernel(d.client, d.state_dir)
        mcp_headers, mcp_sid = mcp_session(d, alice)
        mcp_workspace = d.state_dir / "workspaces" / mcp_sid
        assert (mcp_workspace / "m.txt").exists()
        bob_sid = bob_http.post("/v1/sessions", json={}).json()["id"]
        r = bob_http.post("/v1/tools/python/invoke",
                          json={"session": bob_sid, "arguments": {"code": "y = 1"}})
        assert r.status_code == 429, r.text  # alice's kernel holds the only place

        assert "removed 1 token(s) of client 'alice'" in token_cli(
            "remove", "alice", "--tokens-file", str(tokens))

        record = revoked(d, "alice")
        assert record["reason"] == "its tokens were removed"
        ended = {s["id"]: s for s in record["sessions"]}
        assert set(ended) == {sid, mcp_sid}
        assert ended[sid]["kernels"] == ["restricted"] and ended[sid]["verified"]
        assert record["verified"] and record["mcp_sessions"] == [
            mcp_headers["mcp-session-id"][:8]]
        # ended, not merely unreachable: no kernel process, no workspace, no mount
        wait_until(lambda: not running(pid), timeout=30, what="alice's kernel to end")
        for path in (workspace, mcp_workspace):
            assert not path.exists() and not mounted(path)
        assert not list(d.state_dir.glob(f"sessions/{sid}*"))
        # the cap's place is free: bob gets his kernel
        r = bob_http.post("/v1/tools/python/invoke",
                          json={"session": bob_sid, "arguments": {"code": "y = 1\ny"}})
        assert r.status_code == 200 and r.json()["value"] == 1, r.text
        assert r.json()["kernel"]["fresh"]
        # a new token for alice finds nothing of the old: 404, never a session back
        again = token_cli("add", "alice", "--tokens-file", str(tokens))
        with http(d, again) as alice_http:
            wait_until(lambda: alice_http.get("/v1/sessions").status_code == 200, timeout=30,
                       what="alice's new token accepted")
            assert alice_http.get(f"/v1/sessions/{sid}").status_code == 404
            assert alice_http.get("/v1/sessions").json() == []
        assert mcp_status(d, {**mcp_headers, "Authorization": f"Bearer {again}"}) == 404
        # bob was never touched
        assert bob_http.get(f"/v1/sessions/{bob_sid}").status_code == 200
        assert all(r["client"] != "bob" for r in audit_records(d.audit_path, "client_revoked"))


def test_rotation_keeps_the_session_and_its_variable(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    old = add_token(tokens, "alice")
    canary = add_token(tokens, "bob")  # revoked after the rotation: proof a check ran
    env = {"SANDBOXD_TOKENS_FILE": str(tokens), "SANDBOXD_CONTAINER_ENABLED": "false"}
    with running_daemon(tmp_path, env=env, token=old) as d, http(d, canary) as bob_http:
        sid, pid, workspace = session_with_kernel(d.client, d.state_dir)
        assert bob_http.post("/v1/sessions", json={}).status_code == 201
        new = token_cli("add", "alice", "--label", "rotated", "--tokens-file", str(tokens))
        token_cli("remove", "--id", hash_token(old)[:12], "--tokens-file", str(tokens))
        token_cli("remove", "bob", "--tokens-file", str(tokens))
        revoked(d, "bob")  # the check that revoked bob saw alice's old token gone
        assert [r["client"] for r in audit_records(d.audit_path, "client_revoked")] == ["bob"]
        assert d.client.get("/v1/sessions").status_code == 401  # the old token is refused
        with http(d, new) as alice_http:
            r = alice_http.post("/v1/tools/python/invoke",
                                json={"session": sid, "arguments": {
                                    "code": "x + 1, open('notes.txt').read()"}})
            assert r.status_code == 200, r.text
            assert r.json()["value"] == [42, "kept"] and not r.json()["kernel"]["fresh"]
        assert running(pid) and kernel_process(workspace).pid == pid


def test_expiry_revokes_without_a_request(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    admin = add_token(tokens, "admin")
    env = {"SANDBOXD_TOKENS_FILE": str(tokens), "SANDBOXD_CONTAINER_ENABLED": "false"}
    with running_daemon(tmp_path, env=env, token=admin) as d:
        # an expiry far beyond the wait below for the set-up (however slow), then brought
        # forward to seconds from now by an edit of the file: a revocation within the wait
        # can only come from the near expiry, and no set-up time is spent waiting for it
        far = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
        carol = add_token(tokens, "carol", expires=far)
        with http(d, carol) as carol_http:
            wait_until(lambda: carol_http.get("/v1/sessions").status_code == 200, timeout=10,
                       what="carol's token accepted")
            sid, pid, workspace = session_with_kernel(carol_http, d.state_dir)
        expires = (datetime.now(UTC) + timedelta(seconds=3)).replace(microsecond=0)
        tokens.write_text(tokens.read_text().replace(iso(far), iso(expires)))
        assert TokenStore.load(tokens).entries[-1].expires == iso(expires)
        # no request from here on: the daemon notices the expiry itself
        record = revoked(d, "carol")
        assert datetime.now(UTC) >= expires
        assert record["reason"] == "its tokens expired"
        assert [s["id"] for s in record["sessions"]] == [sid] and record["verified"]
        wait_until(lambda: not running(pid), timeout=30, what="carol's kernel to end")
        assert not workspace.exists() and not mounted(workspace)


def test_a_broken_tokens_file_revokes_nobody(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    alice = add_token(tokens, "alice")
    only_alice = tokens.read_text()
    canary = add_token(tokens, "bob")
    env = {"SANDBOXD_TOKENS_FILE": str(tokens), "SANDBOXD_CONTAINER_ENABLED": "false"}
    with running_daemon(tmp_path, env=env, token=alice) as d, http(d, canary) as bob_http:
        sid, pid, workspace = session_with_kernel(d.client, d.state_dir)
        assert bob_http.post("/v1/sessions", json={}).status_code == 201
        tokens.write_text("tokens: [\n")  # a half-written edit; no request while it lasts
        wait_until(lambda: "tokens file not reloaded" in d.log(), timeout=30,
                   what="the daemon to refuse the broken tokens file")
        # fixed, without bob: the check that revokes bob comes after the broken file's
        tokens.write_text(only_alice)
        revoked(d, "bob")
        assert [r["client"] for r in audit_records(d.audit_path, "client_revoked")] == ["bob"]
        r = d.invoke("python", {"code": "x"}, session=sid)
        assert r.status_code == 200 and r.json()["value"] == 41, r.text
        assert running(pid) and workspace.exists()


def test_refresh_keeps_the_last_good_tokens(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    add_token(tokens, "alice")
    store = TokenStore.load(tokens)
    tokens.write_text("tokens: [\n")
    store.refresh()
    assert store.valid_clients() == {"alice"}
    tokens.write_text("tokens: []\n")
    store.refresh()
    assert store.valid_clients() == set()
