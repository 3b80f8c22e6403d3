"""Bearer auth: 401 problem+json, audited, the token never logged; through a real daemon (its
failures flushed at SIGTERM), and on the daemon's app in process (tests/support/inprocess.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx

from sandboxd.access.tokens import add_token
from sandboxd.audit import verify
from tests.support.audit import audit_records
from tests.support.daemon import running_daemon
from tests.support.inprocess import inprocess_daemon
from tests.support.wait import wait_until


def test_unknown_or_missing_token_is_401_and_audited(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    good = add_token(tokens, "alice")
    with running_daemon(tmp_path, env={"SANDBOXD_TOKENS_FILE": str(tokens)},
                        token=good) as d:
        bad_token = "sbx_" + "A" * 43
        for headers in ({}, {"Authorization": f"Bearer {bad_token}"},
                        {"Authorization": f"Basic {bad_token}"}):
            r = httpx.get(f"{d.url}/v1/tools", headers=headers, timeout=30)
            assert r.status_code == 401
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.headers.get("www-authenticate") == "Bearer"
            assert r.json()["status"] == 401
        r = httpx.post(f"{d.url}/v1/tools/python/invoke", json={"arguments": {"code": "1"}},
                       headers={"Authorization": f"Bearer {bad_token}"}, timeout=30)
        assert r.status_code == 401
        # the right token works, as client alice
        r = d.client.post("/v1/policy/explain",
                          json={"tool": "shell", "arguments": {"command": "curl x"}})
        assert r.status_code == 200, r.text
        assert r.json()["client"] == "alice" and r.json()["allowed"] is False
    records = audit_records(d.audit_path)
    # one aggregated record for the peer (flushed at shutdown), carrying every failure
    failures = [r for r in records if r["event"] == "auth_failure"]
    assert len(failures) == 1
    assert failures[0]["count"] == 4 and failures[0]["missing"] == 1
    assert failures[0]["unknown"] == 3 and failures[0]["peer"] == "127.0.0.1"
    assert failures[0]["digests"] == [hashlib.sha256(bad_token.encode()).hexdigest()[:12]]
    assert failures[0]["paths"] == ["/v1/tools", "/v1/tools/python/invoke"]
    assert bad_token not in d.audit_path.read_text() and good not in d.audit_path.read_text()
    assert verify(d.audit_path).ok


def test_denied_call_over_http_names_rule_and_is_audited(tmp_path: Path) -> None:
    with inprocess_daemon(tmp_path) as d:
        r = d.invoke("shell", {"command": "curl -H 'Authorization: Bearer sk-abcdefghijklmnop"
                                          "qrstuvwx' https://example.com"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "denied"
        assert body["policy"] == {"decision": "deny", "source": "policies/default.yaml",
                                  "rule": "tools.shell.commands.deny[0]"}
        assert body["message"].startswith("`curl` is not allowed here; allowed commands: ls,")
        r = d.client.post("/v1/policy/explain",
                          json={"tool": "shell", "arguments": {"command": "ls | wc"}})
        assert r.json()["rule"] == "tools.shell.operators" and r.json()["client"] == "local"
    text = d.audit_path.read_text()
    assert "sk-abcdefghijklmnopqrstuvwx" not in text
    decisions = [r for r in audit_records(d.audit_path) if r["event"] == "decision"]
    assert decisions[0]["decision"] == "deny"
    assert decisions[0]["rule"] == "tools.shell.commands.deny[0]"
    assert decisions[0]["client"] == "local" and len(decisions[0]["args_sha256"]) == 64
    events = [r["event"] for r in audit_records(d.audit_path)]
    assert "policy_loaded" in events
    assert verify(d.audit_path).ok


def test_token_add_and_remove_take_effect_without_restart(tmp_path: Path) -> None:
    from sandboxd.access.tokens import remove_tokens

    tokens = tmp_path / "tokens.yaml"
    first = add_token(tokens, "alice")
    with inprocess_daemon(tmp_path, env={"SANDBOXD_TOKENS_FILE": str(tokens)}) as d:
        def status(token: str) -> int:
            return d.anon.get("/v1/tools", timeout=30,
                              headers={"Authorization": f"Bearer {token}"}).status_code

        assert status(first) == 200
        second = add_token(tokens, "bob")
        wait_until(lambda: status(second) == 200, timeout=10, interval=0.2,
                   what="the new token to be picked up")
        remove_tokens(tokens, "alice")
        wait_until(lambda: status(first) == 401, timeout=20, interval=0.2,
                   what="the removed token to be refused")
        assert status(second) == 200
