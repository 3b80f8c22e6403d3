"""No message left unanswered, found by the JSON-RPC fuzz (tests/api/test_fuzz.py): every malformed
``POST /mcp`` message gets one clear JSON-RPC error at once; none is taken for a notification
and left unanswered (``202``), and an unknown protocol version is named as such. Raw HTTP
(the SDK would not send these), on the daemon's app in process (tests/support/inprocess.py):
the envelope is the protocol's, whatever runs the calls."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.mcp.conftest import McpDaemon
from tests.support.mcp_raw import RawMcp, messages_of

INVALID_REQUEST = -32600
UNSUPPORTED_VERSION = -32022


@pytest.fixture
def mcp(inproc_mcp_daemon: McpDaemon) -> Iterator[RawMcp]:
    d = inproc_mcp_daemon
    session = RawMcp(d.daemon.url, d.daemon.headers, transport=d.sync_transport())
    yield session
    session.close()


@pytest.mark.parametrize("ident", [None, True, 1.5, [1], {"a": 1}],
                         ids=["null", "true", "fraction", "array", "object"])
def test_a_request_with_a_bad_id_is_answered_not_dropped(mcp: RawMcp, ident: object) -> None:
    r = mcp.post_json({"jsonrpc": "2.0", "id": ident, "method": "tools/list"})
    assert r.status_code == 400, (r.status_code, r.text)
    (answer,) = messages_of(r)
    assert answer["id"] is None and answer["error"]["code"] == INVALID_REQUEST, answer
    assert "string or an integer" in answer["error"]["message"], answer


@pytest.mark.parametrize(("message", "why"), [
    ([{"jsonrpc": "2.0", "id": 1, "method": "ping"}], "batch"),
    ("ping", "JSON object"),
    ({"jsonrpc": "1.0", "id": 3, "method": "ping"}, '"jsonrpc": "2.0"'),
    ({"jsonrpc": "2.0", "id": 4, "method": 5}, '"method" must be a string'),
    ({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": [1]}, '"params" must be'),
    ({"jsonrpc": "2.0", "id": 6}, '"method"'),
], ids=["batch", "string", "jsonrpc-1.0", "method-type", "params-array", "no-method"])
def test_a_malformed_envelope_is_one_clear_invalid_request(mcp: RawMcp, message: object,
                                                           why: str) -> None:
    r = mcp.post_json(message)
    assert r.status_code == 400, (r.status_code, r.text)
    (answer,) = messages_of(r)
    assert answer["error"]["code"] == INVALID_REQUEST and why in answer["error"]["message"]
    assert "pydantic" not in r.text and "validation error" not in r.text.lower(), r.text
    ident = message.get("id") if isinstance(message, dict) else None
    assert answer["id"] == ident, answer  # echoed when it is a valid one


@pytest.mark.parametrize("version", ["1999-01-01", "x"])
def test_an_unknown_protocol_version_says_so(mcp: RawMcp, version: str) -> None:
    r = mcp.post_json({"jsonrpc": "2.0", "id": 40, "method": "tools/list"},
                      {"mcp-protocol-version": version})
    assert r.status_code == 400, r.text
    answer = r.json()
    assert answer["id"] == 40 and answer["error"]["code"] == UNSUPPORTED_VERSION, answer
    assert "is not a version this server speaks" in answer["error"]["message"], answer
    assert "2025-06-18" in answer["error"]["data"]["supported"]


def test_valid_messages_still_pass_through(mcp: RawMcp) -> None:
    """The body read for the check is given back to the SDK whole."""
    r = mcp.post_json({"jsonrpc": "2.0", "id": "s", "method": "tools/list", "params": {}})
    (answer,) = [m for m in messages_of(r) if "result" in m]
    assert answer["id"] == "s" and {t["name"] for t in answer["result"]["tools"]} >= {"python"}
    big = "x" * 300_000
    answer = mcp.call("write_file", {"path": "big.txt", "content": big}, ident=2**40)
    assert answer["id"] == 2**40 and answer["result"]["isError"] is False, answer
    r = mcp.post(json.dumps({"jsonrpc": "2.0", "method": "notifications/progress",
                             "params": {"progressToken": 1, "progress": 1}}).encode())
    assert r.status_code == 202, r.text
