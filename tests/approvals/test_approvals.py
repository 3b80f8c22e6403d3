"""Approvals through a real daemon (tokens, the restricted python backend): a call the policy
gates waits for a person's yes without holding an execution slot; approved it runs, denied or
expired it does not (proved from the workspace on disk); a session-scoped yes covers the
session's next call; only listed approvers see and decide; every step is audited with who."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandboxd.access.tokens import add_token
from tests.support import cli
from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.wait import wait_until

POLICY = """\
version: 1
name: gated
clients: [alice, lead, mallory, oncall]
tools:
  python:
    backend: restricted
    approve: {by: [lead], approval_timeout_s: 120}
  list_files: {paths: {allow: ["**"]}}
"""
HASTY = """\
version: 1
name: hasty
clients: [eve]
tools:
  python:
    backend: restricted
    approve: {by: [lead], approval_timeout_s: 1}
"""
WRITE = "open('proof.txt', 'w').write('ran')\nprint('wrote')"


@dataclass
class Gated:
    daemon: RunningDaemon
    keys: dict[str, str]
    pool: ThreadPoolExecutor

    def post(self, who: str, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.daemon.url}{path}", json=body, timeout=300,
                          headers={"Authorization": f"Bearer {self.keys[who]}"})

    def get(self, who: str, path: str) -> httpx.Response:
        return httpx.get(f"{self.daemon.url}{path}", timeout=60,
                         headers={"Authorization": f"Bearer {self.keys[who]}"})

    def call(self, who: str, tool: str, arguments: dict[str, Any],
             session: str | None = None) -> Future[httpx.Response]:
        body: dict[str, Any] = {"arguments": arguments}
        if session is not None:
            body["session"] = session
        return self.pool.submit(self.post, who, f"/v1/tools/{tool}/invoke", body)

    def pending(self, count: int = 1) -> list[dict[str, Any]]:
        """Wait until the approver sees ``count`` pending approvals."""
        def seen() -> tuple[list[dict[str, Any]]] | None:
            listed = self.get("lead", "/v1/approvals").json()
            return (listed,) if len(listed) == count else None

        return wait_until(seen, timeout=60, what=f"{count} pending approvals")[0]

    def session(self, who: str) -> str:
        r = self.post(who, "/v1/sessions", {})
        assert r.status_code in (200, 201), r.text
        return str(r.json()["id"])

    def workspace(self, session: str) -> Path:
        return self.daemon.state_dir / "workspaces" / session


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gated]:
    tmp = tmp_path_factory.mktemp("approvals")
    (tmp / "policies").mkdir()
    (tmp / "policies" / "gated.yaml").write_text(POLICY)
    (tmp / "policies" / "hasty.yaml").write_text(HASTY)
    tokens = tmp / "tokens.yaml"
    keys = {n: add_token(tokens, n) for n in ("alice", "lead", "mallory", "eve")}
    # tokens with the approvers role: another client's, and one of the caller's own client
    keys["oncall"] = add_token(tokens, "oncall", role="approvers")
    keys["alice-approver"] = add_token(tokens, "alice", role="approvers")
    env = {"SANDBOXD_TOKENS_FILE": str(tokens), "SANDBOXD_MAX_CONCURRENCY": "1",
           "SANDBOXD_RATE_LIMIT_PER_MINUTE": "0", "SANDBOXD_QUEUE_TIMEOUT_S": "300"}
    with running_daemon(tmp, policies_dir=tmp / "policies", env=env,
                        token=keys["alice"]) as d, ThreadPoolExecutor(4) as pool:
        yield Gated(d, keys, pool)


def test_a_waiting_call_holds_no_slot_and_runs_once_approved(gated: Gated) -> None:
    sid = gated.session("alice")
    waiting = gated.call("alice", "python", {"code": WRITE}, sid)
    [pending] = gated.pending()
    assert (pending["client"], pending["tool"], pending["session"]) == ("alice", "python", sid)
    assert pending["arguments"] == {"code": WRITE}
    assert pending["rule"] == "tools.python.approve"
    # one execution slot (max_concurrency 1), and an ungated call still runs meanwhile
    other = gated.post("alice", "/v1/tools/list_files/invoke", {"arguments": {"path": "."}})
    assert other.json()["status"] == "ok", other.text
    assert not waiting.done() and not (gated.workspace(sid) / "proof.txt").exists()
    answer = gated.post("lead", f"/v1/approvals/{pending['id']}",
                        {"decision": "approve", "reason": "looks fine"})
    assert answer.status_code == 200, answer.text
    result = waiting.result(timeout=120).json()
    assert result["status"] == "ok", result
    assert result["stdout"] == "wrote\n"
    assert result["approval"]["state"] == "approved"
    assert result["approval"]["by"] == "lead"
    assert (gated.workspace(sid) / "proof.txt").read_text() == "ran"
    requested = [r for r in audit_records(gated.daemon.audit_path, "approval_requested")
                 if r["approval"] == pending["id"]]
    decided = [r for r in audit_records(gated.daemon.audit_path, "approval_decided")
               if r["approval"] == pending["id"]]
    assert requested[0]["client"] == "alice" and requested[0]["approvers"] == ["lead"]
    assert (decided[0]["by"], decided[0]["decision"], decided[0]["reason"]) == (
        "lead", "approved", "looks fine")


def test_a_denied_call_does_not_run(gated: Gated) -> None:
    sid = gated.session("alice")
    waiting = gated.call("alice", "python", {"code": WRITE}, sid)
    [pending] = gated.pending()
    # only a listed approver sees or decides it
    assert gated.get("mallory", "/v1/approvals").json() == []
    refused = gated.post("mallory", f"/v1/approvals/{pending['id']}", {"decision": "approve"})
    assert refused.status_code == 403
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert gated.post("lead", "/v1/approvals/apr_nothing", {"decision": "deny"}
                      ).status_code == 404
    gated.post("lead", f"/v1/approvals/{pending['id']}",
               {"decision": "deny", "reason": "no writes today"})
    result = waiting.result(timeout=120).json()
    assert result["status"] == "denied", result
    assert result["approval"]["state"] == "denied" and result["approval"]["by"] == "lead"
    assert "lead denied it: no writes today" in result["message"]
    assert not (gated.workspace(sid) / "proof.txt").exists()
    assert not any(r["request_id"] == result["id"]
                   for r in audit_records(gated.daemon.audit_path, "result")
                   if r.get("status") == "ok")
    # decided already: a second answer finds nothing pending
    assert gated.post("lead", f"/v1/approvals/{pending['id']}", {"decision": "approve"}
                      ).status_code == 404


def test_nobody_answering_expires_the_request(gated: Gated) -> None:
    sid = gated.session("eve")
    result = gated.call("eve", "python", {"code": WRITE}, sid).result(timeout=120).json()
    assert result["status"] == "denied", result
    assert result["approval"]["state"] == "expired" and result["approval"]["by"] is None
    assert "nobody answered within 1 s" in result["message"]
    assert not (gated.workspace(sid) / "proof.txt").exists()
    expired = [r for r in audit_records(gated.daemon.audit_path, "approval_expired")
               if r["session"] == sid]
    assert expired and expired[0]["client"] == "eve"


def test_a_session_scoped_approval_covers_the_next_call(gated: Gated) -> None:
    sid = gated.session("alice")
    first = gated.call("alice", "python", {"code": "print(1)"}, sid)
    [pending] = gated.pending()
    gated.post("lead", f"/v1/approvals/{pending['id']}",
               {"decision": "approve", "scope": "session", "minutes": 10})
    assert first.result(timeout=120).json()["status"] == "ok"
    # the next matching call of that session runs without a new request
    second = gated.call("alice", "python", {"code": WRITE}, sid).result(timeout=120).json()
    assert second["status"] == "ok", second
    assert second["approval"]["scope"] == "session" and second["approval"]["by"] == "lead"
    assert (gated.workspace(sid) / "proof.txt").read_text() == "ran"
    assert len([r for r in audit_records(gated.daemon.audit_path, "approval_requested")
                if r["session"] == sid]) == 1
    # another session is not covered
    other = gated.session("alice")
    third = gated.call("alice", "python", {"code": "print(3)"}, other)
    [again] = gated.pending()
    assert again["session"] == other
    gated.post("lead", f"/v1/approvals/{again['id']}", {"decision": "deny"})
    assert third.result(timeout=120).json()["status"] == "denied"


def _cli(gated: Gated, who: str, *args: str) -> Any:
    return cli.run("approvals", *args, "--url", gated.daemon.url, "--token", gated.keys[who],
                   env={"PATH": "/usr/bin:/bin", "SANDBOXD_CONFIG": "/nonexistent"})


def test_the_cli_lists_and_approves(gated: Gated) -> None:
    sid = gated.session("alice")
    waiting = gated.call("alice", "python", {"code": "print('from the cli')"}, sid)
    [pending] = gated.pending()
    listed = _cli(gated, "lead", "list")
    assert listed.returncode == 0, listed.stderr
    [line] = listed.stdout.splitlines()
    assert line.startswith(f"{pending['id']}  client=alice  tool=python  session={sid}  "
                           "rule=tools.python.approve")
    assert "print('from the cli')" in line
    # a non-approver sees nothing and may not decide: one line, exit 1
    assert _cli(gated, "mallory", "list").stdout == ""
    refused = _cli(gated, "mallory", "approve", pending["id"])
    assert refused.returncode == 1
    assert refused.stderr.startswith("sandboxd: HTTP 403: client 'mallory' may not decide")
    assert len(refused.stderr.splitlines()) == 1
    approved = _cli(gated, "lead", "approve", pending["id"], "--reason", "ok by me")
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout == f"{pending['id']}: approved by lead\n"
    result = waiting.result(timeout=120).json()
    assert (result["status"], result["stdout"]) == ("ok", "from the cli\n")
    gone = _cli(gated, "lead", "deny", pending["id"])
    assert gone.returncode == 1 and "HTTP 404" in gone.stderr


def test_a_caller_that_goes_away_withdraws_its_request(gated: Gated) -> None:
    sid = gated.session("alice")
    body = json.dumps({"arguments": {"code": WRITE}, "session": sid}).encode()
    host, port = gated.daemon.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(b"POST /v1/tools/python/invoke HTTP/1.1\r\nHost: sandboxd\r\n"
                     b"Authorization: Bearer " + gated.keys["alice"].encode() + b"\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        [pending] = gated.pending()
    # the connection closed while the call waited: no longer pending, audited, never ran
    gated.pending(0)

    def withdrawn_and_result() -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The withdrawal's record and its call's result, once both are written (the request
        leaves the pending list before the two records are)."""
        records = audit_records(gated.daemon.audit_path)
        withdrawn = [r for r in records if r["event"] == "approval_withdrawn"
                     and r["approval"] == pending["id"]]
        results = [r for r in records if r["event"] == "result" and withdrawn
                   and r["request_id"] == withdrawn[0]["request_id"]]
        return (withdrawn[0], results[0]) if results else None

    withdrawn, result = wait_until(withdrawn_and_result, timeout=30,
                                   what="the withdrawal and its result audited")
    assert len([r for r in audit_records(gated.daemon.audit_path)
                if r.get("approval") == pending["id"]
                and r["event"] == "approval_withdrawn"]) == 1
    assert withdrawn["request_id"] == result["request_id"]
    assert result["status"] == "killed"
    assert not (gated.workspace(sid) / "proof.txt").exists()


def test_a_token_with_the_approvers_role_decides_others_calls(gated: Gated) -> None:
    sid = gated.session("alice")
    waiting = gated.call("alice", "python", {"code": "print('on call')"}, sid)
    [pending] = gated.pending()
    # alice's own approver token may not approve alice's call (the rule does not list alice)
    assert gated.get("alice-approver", "/v1/approvals").json() == []
    assert gated.post("alice-approver", f"/v1/approvals/{pending['id']}",
                      {"decision": "approve"}).status_code == 403
    [seen] = gated.get("oncall", "/v1/approvals").json()
    assert seen["id"] == pending["id"]
    assert gated.post("oncall", f"/v1/approvals/{pending['id']}",
                      {"decision": "approve"}).status_code == 200
    result = waiting.result(timeout=120).json()
    assert (result["status"], result["approval"]["by"]) == ("ok", "oncall")
