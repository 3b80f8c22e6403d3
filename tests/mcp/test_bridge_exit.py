"""The stdio bridge ends with its host: at the end of stdin (the host closed the pipe, as most
hosts do when a chat ends) and on SIGTERM, each time ending its MCP session first. A bridge
that outlived its stdin held one process per chat on hosts that do not kill it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.mcp.conftest import McpDaemon, open_mcp_sessions
from tests.support.wait import wait_until

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "host", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
HANG = 30.0  # catches a bridge that does not end at all; it ends in well under a second


def _bridge(d: McpDaemon) -> subprocess.Popen[bytes]:
    """A bridge that has answered the host's initialize (its MCP session is open)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandboxd", "mcp", "--url", d.daemon.url,
         "--token-file", str(d.token_file("bob"))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write((json.dumps(INITIALIZE) + "\n" + json.dumps(INITIALIZED) + "\n").encode())
    proc.stdin.flush()
    answer = json.loads(proc.stdout.readline())
    assert answer["id"] == 1 and "result" in answer, answer
    return proc


@pytest.mark.parametrize("end", ["stdin closed", "SIGTERM"])
def test_the_bridge_ends_with_its_host_and_ends_its_session(mcp_daemon: McpDaemon,
                                                            end: str) -> None:
    before = open_mcp_sessions(mcp_daemon.daemon)
    proc = _bridge(mcp_daemon)
    assert proc.stdin is not None
    try:
        wait_until(lambda: open_mcp_sessions(mcp_daemon.daemon) == before + 1, timeout=30,
                   what="the bridge's MCP session open")
        t0 = time.monotonic()
        if end == "SIGTERM":  # stdin stays open: a host that signals instead of closing
            proc.send_signal(signal.SIGTERM)
        else:
            proc.stdin.close()
        code = proc.wait(HANG)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, proc.stderr.read() if proc.stderr else code
    print(f"bridge ended {took:.2f} s after {end}")
    # the bridge ended its MCP session on its way out (DELETE), not left it to idle out
    assert open_mcp_sessions(mcp_daemon.daemon) == before
