"""SIGTERM with a live MCP session: the daemon drains and exits (an open notification stream does
not hold it up) and the session's workspace is deleted."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

from tests.mcp.conftest import http_session
from tests.support.daemon import running_daemon


async def test_sigterm_ends_mcp_sessions_and_exits(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as d:
        async with http_session(f"{d.url}/mcp", None) as session:
            result = await session.call_tool("write_file", {"path": "a.txt", "content": "x"})
            sid = result.structured_content["session"]
            await asyncio.sleep(0.5)  # the client's GET stream is open now
            d.proc.send_signal(signal.SIGTERM)
            # a hang would be the bug: the bound only keeps a failing run from stalling the suite
            code = await asyncio.to_thread(d.proc.wait, 60)
        assert code == 0, d.log()[-3000:]
    records = [json.loads(line) for line in d.audit_path.read_text().splitlines()]
    deleted = [r for r in records if r["event"] in ("session_deleted", "session_expired")
               and r.get("session") == sid]
    assert deleted, [r["event"] for r in records]
    assert records[-1]["event"] == "shutdown"
    assert not list(d.state_dir.rglob(f"*{sid}*"))
