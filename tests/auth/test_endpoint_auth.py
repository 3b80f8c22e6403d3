"""Operational endpoints and failed logins (a token holder's metrics are private, and a
guesser must not flood the log) through the daemon's app in process (tests/support/inprocess.py):
with tokens, the operational endpoints need one (unless opened), failed authentications are limited
per peer (429 + Retry-After) and audited as one aggregated record per peer per interval, with
nothing lost."""

from __future__ import annotations

import hashlib
from pathlib import Path

from sandboxd.access.tokens import add_token
from sandboxd.audit import verify
from tests.support.audit import audit_records as records
from tests.support.inprocess import answers, inprocess_daemon
from tests.support.wait import wait_until

GUARDED = ("/metrics", "/readyz", "/openapi.json", "/docs", "/redoc")


def test_operational_endpoints_need_a_token(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    good = add_token(tokens, "alice")
    with inprocess_daemon(tmp_path, env={"SANDBOXD_TOKENS_FILE": str(tokens)}, token=good) as d:
        assert d.anon.get("/healthz", timeout=30).status_code == 200
        for path in GUARDED:
            r = d.anon.get(path, timeout=30)
            assert r.status_code == 401, (path, r.status_code, r.text[:200])
            assert r.headers["www-authenticate"] == "Bearer"
            assert "# HELP" not in r.text and '"paths"' not in r.text and "<html" not in r.text
            r = d.anon.get(path, timeout=30,
                           headers={"Authorization": "Bearer sbx_" + "B" * 43})
            assert r.status_code == 401, path
            r = d.client.get(path)
            assert r.status_code in (200, 503) if path == "/readyz" else r.status_code == 200, \
                (path, r.status_code)
        assert "/v1/tools/{name}/invoke" in d.client.get("/openapi.json").json()["paths"]
        assert "sandboxd_invocations" in d.client.get("/metrics").text or \
            "sandboxd_queue_depth" in d.client.get("/metrics").text


def test_open_endpoints_setting_opens_them(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    add_token(tokens, "alice")
    env = {"SANDBOXD_TOKENS_FILE": str(tokens),
           "SANDBOXD_OPEN_ENDPOINTS": '["metrics", "readyz", "docs"]'}
    with inprocess_daemon(tmp_path, env=env) as d:
        for path in GUARDED:
            r = d.anon.get(path, timeout=30)
            assert r.status_code in (200, 503) if path == "/readyz" else r.status_code == 200, \
                (path, r.status_code)
        assert d.anon.get("/v1/tools", timeout=30).status_code == 401
    env["SANDBOXD_OPEN_ENDPOINTS"] = '["metrics"]'
    with inprocess_daemon(tmp_path, env=env) as d:
        assert d.anon.get("/metrics", timeout=30).status_code == 200
        assert d.anon.get("/readyz", timeout=30).status_code == 401
        assert d.anon.get("/openapi.json", timeout=30).status_code == 401


def test_without_tokens_everything_stays_open(tmp_path: Path) -> None:
    with inprocess_daemon(tmp_path) as d:
        for path in GUARDED:
            r = d.anon.get(path, timeout=30)
            assert r.status_code in (200, 503) if path == "/readyz" else r.status_code == 200


def test_failed_authentications_are_limited_and_aggregated(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    good = add_token(tokens, "alice")
    env = {"SANDBOXD_TOKENS_FILE": str(tokens), "SANDBOXD_AUTH_FAILURE_LIMIT": "5",
           "SANDBOXD_AUTH_FAILURE_WINDOW_S": "3600",  # outlasts a loaded host
           "SANDBOXD_AUTH_FAILURE_AUDIT_INTERVAL_S": "3600"}  # only the shutdown flush
    bad = [f"sbx_{c * 43}" for c in "CDE"]
    with inprocess_daemon(tmp_path, env=env, token=good, script=answers(value=42)) as d:
        size_before = d.audit_path.stat().st_size
        codes = []
        with d.http(timeout=30) as anon:
            for i in range(300):
                headers = {"Authorization": f"Bearer {bad[i % 3]}"} if i % 4 else {}
                r = anon.get("/v1/tools" if i % 2 else "/metrics", headers=headers)
                codes.append(r.status_code)
                if r.status_code == 429:
                    assert int(r.headers["retry-after"]) >= 1
                    assert r.headers["content-type"].startswith("application/problem+json")
                    assert r.json()["status"] == 429
                if i == 150:  # a valid token from the same peer is never locked out
                    assert d.client.get("/v1/tools").status_code == 200
                    assert d.invoke("python", {"code": "6*7"}).json()["value"] == 42
        assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}, codes[:10]
        # one aggregated record at most per interval: none written yet, the log barely grew
        assert records(d.audit_path, "auth_failure") == []
        assert d.audit_path.stat().st_size - size_before < 8192
    failures = records(d.audit_path, "auth_failure")
    assert len(failures) == 1, failures  # flushed at shutdown
    rec = failures[0]
    assert rec["peer"] == "127.0.0.1"
    assert rec["count"] == 300 and rec["limited"] == 295
    assert rec["missing"] == 75 and rec["unknown"] == 225
    assert rec["digests"] == sorted(hashlib.sha256(t.encode()).hexdigest()[:12] for t in bad)
    assert rec["first"] <= rec["last"]
    assert rec["paths"] == ["/metrics", "/v1/tools"]
    text = d.audit_path.read_text()
    assert all(t not in text for t in bad) and good not in text
    assert verify(d.audit_path).ok


def test_failed_authentications_are_flushed_every_interval(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    add_token(tokens, "alice")
    env = {"SANDBOXD_TOKENS_FILE": str(tokens), "SANDBOXD_AUTH_FAILURE_AUDIT_INTERVAL_S": "1"}
    with inprocess_daemon(tmp_path, env=env) as d:
        for _ in range(3):
            assert d.anon.get("/v1/tools", timeout=30).status_code == 401
        wait_until(lambda: sum(r["count"] for r in records(d.audit_path, "auth_failure")) >= 3,
                   timeout=10, interval=0.2, what="auth_failure records of the 3 failures")
        first = records(d.audit_path, "auth_failure")  # the 3 may straddle an interval's end
        assert 1 <= len(first) <= 2 and sum(r["missing"] for r in first) == 3
        assert d.anon.get("/v1/tools", timeout=30,
                          headers={"Authorization": "Bearer nope"}).status_code == 401
    later = records(d.audit_path, "auth_failure")
    assert len(later) == len(first) + 1 and later[-1]["count"] == 1
    assert later[-1]["digests"] == [hashlib.sha256(b"nope").hexdigest()[:12]]
    assert verify(d.audit_path).ok
