"""Every JSON-RPC error answers the request it refuses: its ``id``, never ``null`` when the
request had a valid one (JSON-RPC 2.0 section 5). The door's own refusals (envelope,
protocol version, session cap) and the SDK transport's (unknown or missing session, the
2026-07-28 envelope checks) alike. Raw HTTP: no SDK client would send most of these; on the
daemon's app in process (tests/support/inprocess.py): the refusals are the door's, whatever
runs the calls."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandboxd.access.tokens import add_token
from tests.mcp.conftest import McpDaemon
from tests.support.inprocess import inprocess_daemon
from tests.support.mcp_raw import ACCEPT, RawMcp

MODERN = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {}}


@pytest.fixture
def mcp(inproc_mcp_daemon: McpDaemon) -> Iterator[RawMcp]:
    raw = RawMcp(inproc_mcp_daemon.daemon.url,
                 {"authorization": f"Bearer {inproc_mcp_daemon.tokens['alice']}"},
                 transport=inproc_mcp_daemon.sync_transport())
    yield raw
    raw.close()


def _post(d: McpDaemon, message: Any, headers: dict[str, str]) -> httpx.Response:
    with httpx.Client(transport=d.sync_transport(), timeout=60) as http:
        return http.post(d.url, json=message, headers={
            **ACCEPT, "authorization": f"Bearer {d.tokens['alice']}", **headers})


def _error_of(r: httpx.Response) -> dict[str, Any]:
    assert r.headers["content-type"].startswith("application/json"), r.text
    answer = r.json()
    assert "error" in answer, answer
    return answer  # type: ignore[no-any-return]


def test_a_refused_protocol_version_answers_the_request(mcp: RawMcp) -> None:
    r = mcp.post_json({"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                      {"mcp-protocol-version": "2027-01-01"})
    answer = _error_of(r)
    assert r.status_code == 400 and answer["id"] == 1, answer
    assert answer["error"]["code"] == -32022
    assert answer["error"]["data"]["supported"][-2:] == ["2025-11-25", MODERN], answer


def test_an_unknown_session_answers_the_request(mcp: RawMcp) -> None:
    r = mcp.post_json({"jsonrpc": "2.0", "id": 3, "method": "tools/list"},
                      {"mcp-session-id": "no-such-session"})
    answer = _error_of(r)
    assert r.status_code == 404 and answer["id"] == 3, answer


def test_a_request_without_a_session_answers_the_request(inproc_mcp_daemon: McpDaemon) -> None:
    r = _post(inproc_mcp_daemon, {"jsonrpc": "2.0", "id": "four", "method": "tools/list"},
              {"mcp-protocol-version": "2025-11-25"})
    answer = _error_of(r)
    assert r.status_code == 400 and answer["id"] == "four", answer
    assert "session" in answer["error"]["message"].lower(), answer


@pytest.mark.parametrize(("label", "params", "headers", "code"), [
    ("no envelope", {}, {"mcp-method": "tools/list"}, -32602),
    ("method header differs", {"_meta": META}, {"mcp-method": "tools/call"}, -32020),
    ("version in _meta differs", {"_meta": {**META, "io.modelcontextprotocol/protocolVersion":
                                            "2025-11-25"}}, {"mcp-method": "tools/list"},
     -32020),
])
def test_a_refused_stateless_request_answers_the_request(inproc_mcp_daemon: McpDaemon,
                                                         label: str,
                                                         params: dict[str, Any],
                                                         headers: dict[str, str],
                                                         code: int) -> None:
    r = _post(inproc_mcp_daemon, {"jsonrpc": "2.0", "id": 2**40, "method": "tools/list",
                           "params": params}, {"mcp-protocol-version": MODERN, **headers})
    answer = _error_of(r)
    assert r.status_code == 400 and answer["id"] == 2**40, (label, answer)
    assert answer["error"]["code"] == code, (label, answer)


def test_a_notification_refusal_keeps_a_null_id(inproc_mcp_daemon: McpDaemon) -> None:
    """Nothing to echo: an answer to a message without an id says ``null``."""
    r = _post(inproc_mcp_daemon, {"jsonrpc": "2.0", "method": "notifications/initialized"},
              {"mcp-protocol-version": "2025-11-25", "mcp-session-id": "no-such-session"})
    assert r.status_code == 404, r.text
    assert r.json()["id"] is None


def test_the_session_cap_answers_the_request(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    token = add_token(tokens, "carol")
    env = {"SANDBOXD_TOKENS_FILE": str(tokens), "SANDBOXD_MCP_MAX_SESSIONS_PER_CLIENT": "1"}
    with inprocess_daemon(tmp_path, env=env, token=token) as d:
        auth = {"authorization": f"Bearer {token}"}
        first = RawMcp(d.url, auth, transport=d.transport)
        try:
            r = d.anon.post("/mcp", timeout=60, headers={**ACCEPT, **auth}, json={
                "jsonrpc": "2.0", "id": 6, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "0"}}})
        finally:
            first.close()
    answer = _error_of(r)
    assert r.status_code == 429 and answer["id"] == 6, answer
    assert "mcp_max_sessions_per_client" in answer["error"]["message"]


def test_a_parse_error_keeps_a_null_id(mcp: RawMcp) -> None:
    """A body nested past the SDK's parser is a parse error: its id was not read there, so the
    answer says ``null`` even though a laxer reader could find one (section 5)."""
    deep = "[" * 300 + "]" * 300
    r = mcp.post(('{"jsonrpc": "2.0", "id": 200, "method": "tools/list", "params": {"x": '
                  + deep + "}}").encode())
    answer = _error_of(r)
    assert answer["error"]["code"] == -32700 and answer["id"] is None, answer
