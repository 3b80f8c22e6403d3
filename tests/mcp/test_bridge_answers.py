"""The bridge answers every request of its host, even one the daemon refuses for its ``id``
(JSON-RPC 2.0 section 5: an error with ``"id": null``): a host never waits for an answer that
the bridge dropped."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.mcp.conftest import McpDaemon


def test_a_request_with_a_bad_id_is_answered_through_the_bridge(mcp_daemon: McpDaemon) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandboxd", "mcp", "--url", mcp_daemon.daemon.url,
         "--token-file", str(mcp_daemon.token_file("bob"))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b'{"jsonrpc": "2.0", "id": null, "method": "tools/list"}\n')
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        proc.stdin.close()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert answer["id"] is None and answer["error"]["code"] == -32600, answer
    assert '"id" must be a string or an integer' in answer["error"]["message"], answer
