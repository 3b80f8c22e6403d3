"""The MCP door's ``fork_session`` tool through the official SDK's client and the real daemon:
listed with its title, annotations and output schema; a fork of the model's session carries
its files and Python variables and each fork diverges; another client's session, or bad
arguments, fork nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.mcp.conftest import McpDaemon, sdk_client, text_of
from tests.mcp.test_stateless_state import handle_of, output_of


@pytest.fixture(scope="module", autouse=True)
def warm_door(mcp_daemon: McpDaemon) -> None:
    """The daemon loads the MCP SDK on its first ``/mcp`` request (see test_stateless_state)."""
    assert mcp_daemon.daemon.client.get("/mcp").status_code < 500


def _printed(result: Any) -> str:
    assert result.is_error is False, result
    return output_of(result).strip()


async def test_a_model_forks_its_session_and_each_fork_goes_its_own_way(
        mcp_daemon: McpDaemon) -> None:
    async with sdk_client("http", mcp_daemon) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        tool = tools["fork_session"]
        assert tool.title == "Fork a session" and tool.annotations is not None
        assert tool.annotations.read_only_hint is False
        assert tool.annotations.destructive_hint is False
        assert tool.annotations.open_world_hint is False
        assert tool.input_schema["required"] == ["session"]
        assert tool.output_schema is not None and "kernel" in tool.output_schema["properties"]
        first = await client.call_tool(
            "python", {"code": "x = 41\ndef f():\n    return x + 1\n"
                               "open('seed.txt', 'w').write('seed')"})
        parent = handle_of(first)
        made = await client.call_tool("fork_session", {"session": parent, "count": 2})
        assert made.is_error is False, made
        body = made.structured_content
        assert body["parent"] == parent and body["kernel"]["carried"] is True, body
        one, two = (s["id"] for s in body["sessions"])
        assert one in text_of(made) and two in text_of(made)
        changed = await client.call_tool(
            "python", {"code": "x = 100\nprint(f(), open('seed.txt').read())", "session": one})
        assert _printed(changed) == "101 seed"
        kept = await client.call_tool("python", {"code": "print(f())", "session": two})
        assert _printed(kept) == "42"
        assert _printed(await client.call_tool(
            "python", {"code": "print(f())", "session": parent})) == "42"
        bad = await client.call_tool("fork_session", {"session": parent, "count": 0})
        assert bad.is_error is True and "count" in text_of(bad), bad
        for sid in (parent, one, two):
            assert mcp_daemon.daemon.client.delete(f"/v1/sessions/{sid}").status_code == 204


async def test_another_clients_session_is_not_forked(mcp_daemon: McpDaemon) -> None:
    async with sdk_client("http", mcp_daemon) as alice:
        parent = handle_of(await alice.call_tool("python", {"code": "y = 1"}))
    async with sdk_client("http", mcp_daemon, name="bob") as bob:
        refused = await bob.call_tool("fork_session", {"session": parent})
        assert refused.is_error is True and "nothing was forked" in text_of(refused), refused
    assert mcp_daemon.daemon.client.delete(f"/v1/sessions/{parent}").status_code == 204
