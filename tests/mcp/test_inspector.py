"""A client no one on this project wrote: the MCP Inspector CLI (``@modelcontextprotocol/inspector``
``--cli``, pinned in tests/mcp/inspector/package.json, installed by ``make test`` into
``.cache/npm``) lists the tools and calls ``python``, over Streamable HTTP and by launching the
``sandboxd mcp`` stdio bridge as an MCP host does."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxd.access.tokens import add_token
from sandboxd.audit import verify
from tests.support.audit import audit_records
from tests.support.ci import require
from tests.support.daemon import running_daemon

REPO = Path(__file__).resolve().parents[2]
INSPECTOR = REPO / ".cache/npm/node_modules/@modelcontextprotocol/inspector/cli/build/cli.js"


@pytest.fixture
def inspector() -> list[str]:
    node = shutil.which("node")
    require(node is not None, "node (make test installs nodejs when it is missing)")
    require(INSPECTOR.is_file(), f"the MCP Inspector in {INSPECTOR.parents[4]} (make test "
            "installs it: npm ci from tests/mcp/inspector)")
    return [str(node), str(INSPECTOR), "--cli"]


def run(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def check(inspector: list[str], target: list[str]) -> None:
    listed = run([*inspector, *target, "--method", "tools/list"])
    names = [t["name"] for t in listed["tools"]]
    assert "python" in names and "read_file" in names
    python = next(t for t in listed["tools"] if t["name"] == "python")
    assert python["inputSchema"]["required"] == ["code"]
    called = run([*inspector, *target, "--method", "tools/call", "--tool-name", "python",
                  "--tool-arg", "code=print(6*7)"])
    assert called["isError"] is False
    assert called["content"][0] == {"type": "text", "text": "42\n"}
    assert called["structuredContent"]["status"] == "ok"


def test_inspector_over_streamable_http(tmp_path: Path, inspector: list[str]) -> None:
    with running_daemon(tmp_path) as d:
        check(inspector, [f"{d.url}/mcp", "--transport", "http"])
    calls = [r for r in audit_records(d.audit_path)
             if r["event"] == "result" and r.get("transport") == "mcp"]
    assert [r["status"] for r in calls] == ["ok"]
    assert verify(d.audit_path).ok


def test_inspector_launching_the_stdio_bridge(tmp_path: Path, inspector: list[str]) -> None:
    tokens = tmp_path / "tokens.yaml"
    token = add_token(tokens, "carol")
    token_file = tmp_path / "carol.token"
    token_file.write_text(token)
    with running_daemon(tmp_path, env={"SANDBOXD_TOKENS_FILE": str(tokens)}, token=token) as d:
        check(inspector, [sys.executable, "-m", "sandboxd", "mcp", "--url", d.url,
                          "--token-file", str(token_file)])
    calls = [r for r in audit_records(d.audit_path)
             if r["event"] == "result" and r.get("transport") == "mcp"]
    assert [(r["status"], r["client"]) for r in calls] == [("ok", "carol")]
    assert verify(d.audit_path).ok
