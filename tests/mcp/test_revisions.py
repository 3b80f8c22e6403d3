"""Both protocol eras with the official Python SDK's own client (``mcp.Client``): in
its default ``auto`` mode it probes ``server/discover`` at 2026-07-28 and stays there (it used
to be refused and fall back), over Streamable HTTP and through the stdio bridge; pinned to the
handshake (``mode="legacy"``: 2025-11-25) it still works. In each, a bad-arguments call is an
``isError`` result naming the argument (SEP-1303) and every tool carries its annotations.

The eras over Streamable HTTP run against the daemon's app in process (tests/support/
inprocess.py: the protocol is the door's, a scripted call prints what ``print(6*7)`` prints);
the bridge is a process that dials a URL, and state, progress and cancellation need a real
sandbox (a kernel, a call that lasts, a process to kill): those run on the real daemon."""

from __future__ import annotations

import asyncio
from typing import Any

import mcp.client.session
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.mcp.conftest import McpDaemon, sdk_client, text_of
from tests.support.inprocess import InProcessDaemon, answers, by_code
from tests.support.wait import async_wait_until

TRANSPORTS = ["http", "stdio"]


async def _check_tools_and_calls(client: Client) -> None:
    """What a host and its model meet, the same in every era."""
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert all(t.title and t.annotations and t.output_schema for t in tools.values()), tools
    assert tools["read_file"].annotations.read_only_hint is True  # type: ignore[union-attr]
    assert tools["python"].annotations.destructive_hint is True  # type: ignore[union-attr]
    assert all(t.annotations.open_world_hint is False  # type: ignore[union-attr]
               for t in tools.values())
    ok = await client.call_tool("python", {"code": "print(6*7)"})
    # the output first (at 2026-07-28 a last block names the session: test_stateless_state.py)
    assert ok.is_error is False and ok.content[0].text.strip() == "42", ok  # type: ignore[union-attr]
    bad = await client.call_tool("python", {})
    assert bad.is_error is True, bad
    assert "argument 'code'" in text_of(bad) and "is required" in text_of(bad), bad
    with pytest.raises(MCPError) as unknown:  # an unknown tool stays a protocol error
        await client.call_tool("no_such_tool", {})
    assert unknown.value.error.code == -32602 and "no_such_tool" in unknown.value.error.message


@pytest.fixture
def era_daemon(request: pytest.FixtureRequest, transport: str) -> McpDaemon:
    """Over HTTP the daemon's app in process, whose python calls print what
    ``_check_tools_and_calls`` expects; through the bridge (a process) the real daemon."""
    if transport == "stdio":
        real: McpDaemon = request.getfixturevalue("mcp_daemon")
        return real
    d: McpDaemon = request.getfixturevalue("inproc_mcp_daemon")
    assert isinstance(d.daemon, InProcessDaemon)
    d.daemon.python.script = by_code({"print(6*7)": answers("42\n")})
    return d


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_sdk_client_negotiates_2026_07_28(era_daemon: McpDaemon, transport: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # the SDK falls back to the handshake when its probe takes over 10 s, which a loaded host
    # starting the stdio bridge can take: that is the SDK's choice, not the daemon's answer
    monkeypatch.setattr(mcp.client.session, "DISCOVER_TIMEOUT_SECONDS", 120.0)
    async with sdk_client(transport, era_daemon) as client:
        discovered = client.session.discover_result
        assert client.session.initialize_result is None, "fell back to the handshake"
        assert discovered is not None and "2026-07-28" in discovered.supported_versions
        assert "\"session\" argument" in (discovered.instructions or "")
        await _check_tools_and_calls(client)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_sdk_client_pinned_to_the_handshake_speaks_2025_11_25(era_daemon: McpDaemon,
                                                                    transport: str) -> None:
    async with sdk_client(transport, era_daemon, mode="legacy") as client:
        initialized = client.session.initialize_result
        assert initialized is not None and initialized.protocol_version == "2025-11-25"
        assert client.session.discover_result is None
        await _check_tools_and_calls(client)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_stateless_call_reports_progress(mcp_daemon: McpDaemon, transport: str) -> None:
    """A long call's progress reaches the caller on 2026-07-28 too (on the call's own
    response stream: there is no other)."""
    seen: list[float] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(value)

    async with sdk_client(transport, mcp_daemon) as client:
        assert client.session.discover_result is not None
        result = await client.call_tool("python", {"code": "import time\ntime.sleep(2.5)"},
                                        progress_callback=progress)
    assert result.is_error is False, result
    assert seen and seen == sorted(seen), seen


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_stateless_cancel_stops_the_call(mcp_daemon: McpDaemon, transport: str) -> None:
    """2026-07-28 cancels by closing the call's response stream (the SDK does it over HTTP,
    the bridge for a host's ``notifications/cancelled``): the service's invoke is cancelled and
    the backend kills and verifies, as on an HTTP disconnect."""
    def killed() -> list[dict[str, Any]]:
        return [r for r in mcp_daemon.records() if r["event"] == "result"
                and r.get("transport") == "mcp" and r["status"] == "killed"]

    before = len(killed())
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with sdk_client(transport, mcp_daemon) as client:
        assert client.session.discover_result is not None
        call = asyncio.create_task(client.call_tool(
            "python", {"code": "while True:\n    pass"}, progress_callback=on_progress,
            meta={"sandboxd/limits": {"timeout_s": 120}}))
        await async_wait_until(lambda: progress or call.done(), timeout=60, interval=0.1,
                               what="the call running (its first progress notification)")
        assert not call.done(), call
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # the client stays connected: the cancel alone ends the call
        records = await async_wait_until(lambda: killed()[before:], timeout=30, interval=0.1,
                                         what="the cancelled call's result record")
    assert records[-1]["termination"]["reason"] == "cancelled", records[-1]
    assert records[-1]["cleanup"]["verified"] is True
