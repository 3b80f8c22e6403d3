"""The stdio bridge loads only what it needs: a host waits for its first answer, and
the MCP SDK (most of a second), the daemon's stack and the other commands' modules cost it
that answer's second. Its timing is measured in bench/bench_mcp_bridge.py, not here: this test
reads what a real bridge run imported (``python -X importtime``), answering both eras' first
requests, and catches a hang only (pytest's timeout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.mcp.conftest import McpDaemon

FIRST = [
    {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}}}},
    {"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "host", "version": "1"}}},
]
#: never in the bridge: the SDK, the daemon's web stack, engines, backends, settings, models,
#: the other commands
HEAVY = ("mcp", "mcp_types", "fastapi", "starlette", "uvicorn", "docker", "RestrictedPython",
         "sandboxd.backends", "sandboxd.service", "sandboxd.api", "sandboxd.config",
         "sandboxd.models", "sandboxd.policy", "sandboxd.cli.daemon", "sandboxd.cli.doctor",
         "sandboxd.cli.chat", "sandboxd.client", "sandboxd_client.models",
         "sandboxd_client.sandbox", "sandboxd_client.agent")


def test_the_bridge_imports_nothing_heavy(mcp_daemon: McpDaemon) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "sandboxd", "mcp", "--url",
         mcp_daemon.daemon.url, "--token-file", str(mcp_daemon.token_file("bob"))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        answers = []
        for message in FIRST:
            proc.stdin.write((json.dumps(message) + "\n").encode())
            proc.stdin.flush()
            answers.append(json.loads(proc.stdout.readline()))
        proc.stdin.close()
        assert proc.stderr is not None
        stderr = proc.stderr.read()  # to its end: the bridge exits at the end of stdin
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [(a["id"], "result" in a) for a in answers] == [(1, True), (2, True)], answers
    assert answers[0]["result"]["supportedVersions"] == ["2026-07-28"]
    imported = {line.split("|")[-1].strip() for line in stderr.decode().splitlines()
                if line.startswith("import time:") and "|" in line}
    assert "sandboxd.cli.mcp_bridge" in imported, stderr.decode()[-2000:]
    heavy = sorted(m for m in imported if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert not heavy, heavy
