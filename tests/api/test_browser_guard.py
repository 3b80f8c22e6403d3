"""A web page cannot drive the daemon through the user's browser (DNS rebinding, cross-origin
requests): Origin and, for the tokenless loopback client, Host are checked on the API and on
/mcp, on the daemon's app in process (tests/support/inprocess.py); the unix socket's own rule
through a real daemon on a real socket."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from sandboxd.access.tokens import add_token
from sandboxd.backends.scripted import prints
from tests.support.audit import audit_records
from tests.support.daemon import unix_socket_daemon
from tests.support.inprocess import InProcessDaemon, inprocess_daemon

CALL = {"arguments": {"code": "print('ran')"}}
MCP_INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "page", "version": "0"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


def _problem(r: httpx.Response, slug: str) -> dict[str, object]:
    assert r.status_code == 403, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["type"].endswith("/" + slug), body
    return body


def _calls_audited(d: InProcessDaemon) -> int:
    return len(audit_records(d.audit_path, "result"))


@pytest.fixture
def daemon(inproc: InProcessDaemon) -> InProcessDaemon:
    """The daemon's app in process, its calls printing what CALL prints."""
    inproc.python.script = prints("ran\n")
    return inproc


def test_a_page_origin_is_refused_before_anything_runs(daemon: InProcessDaemon) -> None:
    page = {"Origin": "http://evil.example"}
    before = _calls_audited(daemon)
    body = _problem(daemon.client.post("/v1/tools/python/invoke", json=CALL, headers=page),
                    "origin-not-allowed")
    assert "allowed_origins" in str(body["detail"])
    _problem(daemon.client.get("/v1/tools", headers=page), "origin-not-allowed")
    _problem(daemon.client.post("/mcp", json=MCP_INIT, headers={**page, **MCP_HEADERS}),
             "origin-not-allowed")
    assert _calls_audited(daemon) == before  # nothing ran
    # probes stay open; agents and SDKs send no Origin and are served
    assert daemon.client.get("/healthz", headers=page).status_code == 200
    ok = daemon.client.post("/v1/tools/python/invoke", json=CALL).json()
    assert ok["status"] == "ok" and ok["stdout"] == "ran\n"
    assert daemon.client.post("/mcp", json=MCP_INIT, headers=MCP_HEADERS).status_code == 200
    metrics = daemon.client.get("/metrics").text
    assert 'sandboxd_rejections_total{reason="origin-not-allowed"} 3.0' in metrics


def test_a_rebound_host_name_is_refused_for_the_tokenless_client(daemon: InProcessDaemon) -> None:
    port = 8765  # in process there is no socket: any port the Host header may name
    rebound = {"Host": f"evil.example:{port}"}
    body = _problem(daemon.client.post("/v1/tools/python/invoke", json=CALL, headers=rebound),
                    "host-not-allowed")
    assert "DNS rebinding" in str(body["detail"])
    _problem(daemon.client.post("/mcp", json=MCP_INIT, headers={**rebound, **MCP_HEADERS}),
             "host-not-allowed")
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost", f"[::1]:{port}"):
        assert daemon.client.get("/v1/tools", headers={"Host": host}).status_code == 200, host


def test_admins_can_allow_an_origin_and_a_host(tmp_path: Path) -> None:
    env = {"SANDBOXD_ALLOWED_ORIGINS": '["http://ui.example:3000"]',
           "SANDBOXD_ALLOWED_HOSTS": '["sandbox.lan"]'}
    with inprocess_daemon(tmp_path, env=env, script=prints("ran\n")) as d:
        r = d.client.post("/v1/tools/python/invoke", json=CALL,
                          headers={"Origin": "http://ui.example:3000", "Host": "sandbox.lan:1"})
        assert r.status_code == 200 and r.json()["status"] == "ok", r.text
        _problem(d.client.get("/v1/tools", headers={"Origin": "http://ui.example:3001"}),
                 "origin-not-allowed")


def test_with_tokens_any_host_name_is_served(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    token = add_token(tokens, "ci")
    with inprocess_daemon(tmp_path, env={"SANDBOXD_TOKENS_FILE": str(tokens)},
                          token=token) as d:
        r = d.client.get("/v1/tools", headers={"Host": "sandboxd.internal:8377"})
        assert r.status_code == 200, r.text
        _problem(d.client.get("/v1/tools", headers={"Origin": "http://evil.example"}),
                 "origin-not-allowed")


def test_the_unix_socket_needs_no_host_check_but_checks_origin(tmp_path: Path) -> None:
    with unix_socket_daemon(tmp_path) as sock, httpx.Client(
            transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://x", timeout=60) as http:
        assert http.get("/v1/tools", headers={"Host": "anything"}).status_code == 200
        _problem(http.get("/v1/tools", headers={"Origin": "http://evil.example"}),
                 "origin-not-allowed")
