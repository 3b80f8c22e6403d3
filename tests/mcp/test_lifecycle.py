"""MCP session life cycle through a real daemon: SIGTERM with a live session (the daemon drains and
exits, an open notification stream does not hold it up, the workspace is deleted), and an idle
session expiring with its workspace."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

from tests.mcp.conftest import http_session, open_mcp_sessions
from tests.support.audit import audit_records
from tests.support.daemon import running_daemon
from tests.support.inprocess import inprocess_daemon
from tests.support.wait import async_wait_until, wait_until


async def test_sigterm_ends_mcp_sessions_and_exits(tmp_path: Path) -> None:
    # the access log says when the client's GET stream has opened (its response started)
    with running_daemon(tmp_path, env={"SANDBOXD_ACCESS_LOG": "true"}) as d:
        async with http_session(f"{d.url}/mcp", None) as session:
            result = await session.call_tool("write_file", {"path": "a.txt", "content": "x"})
            sid = result.structured_content["session"]
            await async_wait_until(lambda: '"GET /mcp HTTP/1.1" 200' in d.log(), timeout=30,
                                   what="the client's GET stream to open")
            d.proc.send_signal(signal.SIGTERM)
            # a hang would be the bug: the bound only keeps a failing run from stalling the suite
            code = await asyncio.to_thread(d.proc.wait, 60)
        assert code == 0, d.log()[-3000:]
    records = audit_records(d.audit_path)
    deleted = [r for r in records if r["event"] in ("session_deleted", "session_expired")
               and r.get("session") == sid]
    assert deleted, [r["event"] for r in records]
    assert records[-1]["event"] == "shutdown"
    assert not list(d.state_dir.rglob(f"*{sid}*"))


def _sse_result(body: str) -> dict:
    for line in body.splitlines():
        if line.startswith("data:") and '"result"' in line:
            return json.loads(line[len("data:"):])["result"]
    raise AssertionError(f"no result in {body!r}")


def test_idle_mcp_session_expires_with_its_workspace(tmp_path: Path) -> None:
    headers = {"accept": "application/json, text/event-stream",
               "content-type": "application/json"}
    with inprocess_daemon(tmp_path, env={"SANDBOXD_SESSION_TTL_S": "2"}) as d:
        url = f"{d.url}/mcp"
        r = d.anon.post(url, headers=headers, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "raw", "version": "0"}}}, timeout=30)
        assert r.status_code == 200, r.text
        headers |= {"mcp-session-id": r.headers["mcp-session-id"],
                    "mcp-protocol-version": "2025-06-18"}
        r = d.anon.post(url, headers=headers, timeout=30,
                       json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert r.status_code == 202, r.text
        r = d.anon.post(url, headers=headers, timeout=30, json={
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "write_file", "arguments": {"path": "a", "content": "x"}}})
        sid = _sse_result(r.text)["structuredContent"]["session"]
        # no request in flight and no GET stream: the MCP session idles out after the TTL
        wait_until(lambda: [r for r in audit_records(d.audit_path) if r.get("session") == sid
                            and r["event"] in ("session_deleted", "session_expired")],
                   timeout=30, interval=0.2, what="the idle MCP session's workspace deleted")
        # the MCP session idles out on a timer of its own, which may end just after the
        # workspace's: wait for its end without a request to it (one would keep it alive)
        wait_until(lambda: open_mcp_sessions(d) == 0, timeout=30, interval=0.2,
                   what="the idle MCP session discarded")
        r = d.anon.post(url, headers=headers, timeout=30,
                       json={"jsonrpc": "2.0", "id": 4, "method": "tools/list"})
        assert r.status_code == 404  # the MCP session is gone too
        assert not list(d.state_dir.rglob(f"*{sid}*"))
