"""A real daemon (restricted backend, a tokens file, its own copy of the policies) shared by the
MCP tests of one module, and the official SDK's client over real Streamable HTTP or through the
``sandboxd mcp`` stdio bridge (a real subprocess); the same daemon's app in process on scripted
backends (``inproc_mcp_daemon``, tests/support/inprocess.py) for tests of the protocol alone."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import (
    MCP_DEFAULT_SSE_READ_TIMEOUT,
    MCP_DEFAULT_TIMEOUT,
    create_mcp_http_client,
)

from sandboxd.access.tokens import add_token
from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.inprocess import InProcessDaemon, inprocess_daemon

REPO = Path(__file__).resolve().parents[2]


def open_mcp_sessions(d: RunningDaemon | InProcessDaemon) -> int:
    """The daemon's count of open MCP sessions, from its metrics (a request that touches no
    MCP session, so it keeps none alive)."""
    match = re.search(r"^sandboxd_mcp_sessions (\S+)$", d.client.get("/metrics").text, re.M)
    assert match is not None, "no sandboxd_mcp_sessions in /metrics"
    return int(float(match.group(1)))


@dataclass
class McpDaemon:
    """The daemon, its tokens and its policies directory (editable by a test)."""

    daemon: RunningDaemon | InProcessDaemon
    tokens: dict[str, str]
    policies: Path
    tmp: Path

    @property
    def url(self) -> str:
        return f"{self.daemon.url}/mcp"

    def token_file(self, name: str) -> Path:
        path = self.tmp / f"{name}.token"
        path.write_text(self.tokens[name] + "\n")
        path.chmod(0o600)
        return path

    def records(self) -> list[dict[str, Any]]:
        return audit_records(self.daemon.audit_path)

    def transport(self) -> Any:
        """The transport of an HTTP client of an in-process daemon (None: a real one's)."""
        return (self.daemon.async_transport() if isinstance(self.daemon, InProcessDaemon)
                else None)

    def sync_transport(self) -> Any:
        """Like :meth:`transport`, for a sync client."""
        return self.daemon.transport if isinstance(self.daemon, InProcessDaemon) else None


def _mcp_setup(tmp: Path) -> tuple[Path, dict[str, str], dict[str, str]]:
    """The policies, tokens and settings of an MCP test daemon in ``tmp``."""
    policies = tmp / "policies"
    shutil.copytree(REPO / "policies", policies)
    tokens_file = tmp / "tokens.yaml"
    tokens = {name: add_token(tokens_file, name) for name in ("alice", "bob")}
    env = {"SANDBOXD_TOKENS_FILE": str(tokens_file),
           "SANDBOXD_AUTH_FAILURE_AUDIT_INTERVAL_S": "1"}
    return policies, tokens, env


@pytest.fixture(scope="module")
def mcp_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpDaemon]:
    tmp = tmp_path_factory.mktemp("mcp")
    policies, tokens, env = _mcp_setup(tmp)
    with running_daemon(tmp, policies_dir=policies, env=env, token=tokens["alice"]) as d:
        yield McpDaemon(d, tokens, policies, tmp)


@pytest.fixture
def inproc_mcp_daemon(tmp_path: Path) -> Iterator[McpDaemon]:
    """``mcp_daemon``'s app in process, on scripted backends (its calls print nothing unless
    the test sets ``daemon.python.script``): for tests of the MCP protocol alone."""
    policies, tokens, env = _mcp_setup(tmp_path)
    with inprocess_daemon(tmp_path, policies_dir=policies, env=env, token=tokens["alice"]) as d:
        yield McpDaemon(d, tokens, policies, tmp_path)


Handler = Callable[[Any], Any]


@contextlib.asynccontextmanager
async def client_session(transport: str, d: McpDaemon, name: str = "alice",
                         on_message: Handler | None = None) -> AsyncIterator[ClientSession]:
    """A session of client ``name`` over ``transport``: "http" or "stdio" (the bridge)."""
    if transport == "http":
        async with http_session(d.url, d.tokens[name], on_message,
                                transport=d.transport()) as session:
            yield session
    else:
        async with bridge_session(d.daemon.url, d.token_file(name), on_message) as session:
            yield session


@contextlib.asynccontextmanager
async def http_session(url: str, token: str | None, on_message: Handler | None = None, *,
                       transport: Any = None) -> AsyncIterator[ClientSession]:
    """An initialized SDK client session over Streamable HTTP (``transport``: the HTTP
    client's, e.g. an in-process daemon's)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # the SDK's own client, or one with its settings on ``transport``
    http_client = create_mcp_http_client(headers=headers) if transport is None else \
        httpx2.AsyncClient(headers=headers, transport=transport, timeout=httpx2.Timeout(
            MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT))
    async with (http_client as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write, message_handler=on_message) as session):
        await session.initialize()
        yield session


def bridge_params(url: str, token_file: Path) -> StdioServerParameters:
    """``sandboxd mcp`` as an MCP host launches it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "sandboxd", "mcp", "--url", url, "--token-file", str(token_file)],
        env=env)


@contextlib.asynccontextmanager
async def bridge_session(url: str, token_file: Path,
                         on_message: Handler | None = None) -> AsyncIterator[ClientSession]:
    """An initialized SDK client session through the stdio bridge subprocess."""
    async with (stdio_client(bridge_params(url, token_file)) as (read, write),
                ClientSession(read, write, message_handler=on_message) as session):
        await session.initialize()
        yield session


def text_of(result: Any) -> str:
    return "".join(c.text for c in result.content if c.type == "text")


@contextlib.asynccontextmanager
async def sdk_client(transport: str, d: McpDaemon, mode: str = "auto",
                     name: str = "alice") -> AsyncIterator[Client]:
    """The SDK's high-level client, connected in ``mode`` over ``transport``."""
    if transport == "stdio":
        async with Client(stdio_client(bridge_params(d.daemon.url, d.token_file(name))),
                          mode=mode) as client:  # type: ignore[arg-type]
            yield client
        return
    headers = {"Authorization": f"Bearer {d.tokens[name]}"}
    transport = d.transport()
    async with (create_mcp_http_client(headers=headers) if transport is None else
                httpx2.AsyncClient(headers=headers, transport=transport, timeout=120) as http,
                Client(streamable_http_client(d.url, http_client=http),
                       mode=mode) as client):  # type: ignore[arg-type]
        yield client
