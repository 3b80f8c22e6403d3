"""Bounded at the border, always delivered (a hostile value must not crash a reader):
every value that crosses from a sandbox
into the daemon - display items, the last value - is bounded in nesting depth where the daemon
accepts it and replaced by a note with ``truncated: true`` when over; the client always gets
the audited result: never a 500 on the plain route, an SSE stream that ends with ``result``,
an MCP ``tools/call`` that gets a result. Through a real daemon (restricted backend), over
HTTP, SSE and the official MCP SDK."""

from __future__ import annotations

import json

import pytest

from tests.mcp.conftest import McpDaemon, client_session

#: a list nested 950 deep: within what a sandbox can encode, far past what a client should get
DEEP = "deep = []\nx = deep\nfor _ in range(950):\n    x.append([])\n    x = x[0]\n"
CASES = {"display": DEEP + "display(deep)", "value": DEEP + "deep"}


def depth(value: object) -> int:
    """The nesting depth of a JSON value (iteratively: deep values must not recurse)."""
    best, todo = 0, [(value, 1)]
    while todo:
        item, d = todo.pop()
        if isinstance(item, (list, dict)):
            best = max(best, d)
            todo.extend((v, d + 1) for v in (item.values() if isinstance(item, dict) else item))
    return best


def check_bounded(result: dict, case: str) -> None:
    assert result["status"] == "ok", result
    assert depth(result) <= 80, "a value deeper than the border's bound reached the client"
    if case == "display":  # the sandbox leaves the JSON out itself; the repr stays
        (item,) = result["outputs"]
        assert "application/json" not in item["data"], item
        assert item["data"]["text/plain"].startswith("[[[["), item
    else:
        assert result["value"] is None or isinstance(result["value"], str), result
        assert "64 levels" in (result["message"] or "") + result["stderr"], result


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("session", [False, True])
def test_deep_json_on_the_plain_route(mcp_daemon: McpDaemon, case: str, session: bool) -> None:
    client = mcp_daemon.daemon.client
    body: dict = {"arguments": {"code": CASES[case]}}
    if session:
        body["session"] = client.post("/v1/sessions", json={}).json()["id"]
    resp = client.post("/v1/tools/python/invoke", json=body)
    assert resp.status_code == 200, resp.text[:500]
    check_bounded(resp.json(), case)
    records = [r for r in mcp_daemon.records()
               if r.get("event") == "result" and r.get("invocation") == resp.json()["id"]]
    assert len(records) == 1 and records[0]["status"] == "ok", records


@pytest.mark.parametrize("case", list(CASES))
def test_deep_json_on_the_stream(mcp_daemon: McpDaemon, case: str) -> None:
    client = mcp_daemon.daemon.client
    with client.stream("POST", "/v1/tools/python/invoke",
                       json={"arguments": {"code": CASES[case]}},
                       headers={"accept": "text/event-stream"}) as resp:
        assert resp.status_code == 200
        text = resp.read().decode()
    events = [block for block in text.split("\n\n") if block.strip()]
    names = [line[len("event: "):] for block in events for line in block.splitlines()
             if line.startswith("event: ")]
    assert names and names[-1] == "result", names
    last = events[-1]
    data = json.loads("".join(line[len("data: "):] for line in last.splitlines()
                              if line.startswith("data: ")))
    check_bounded(data, case)


@pytest.mark.parametrize("case", list(CASES))
async def test_deep_json_over_mcp(mcp_daemon: McpDaemon, case: str) -> None:
    async with client_session("http", mcp_daemon) as session:
        result = await session.call_tool("python", {"code": CASES[case]})
    assert result.is_error is False, result
    check_bounded(result.structured_content, case)
