"""The MCP front door on the daemon's unix socket: the SDK's client over Streamable HTTP on the
socket, and the stdio bridge with ``--socket``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from sandboxd.access.tokens import add_token
from tests.mcp.conftest import bridge_params
from tests.mcp.test_mcp import text_of
from tests.support.daemon import unix_socket_daemon


@contextlib.contextmanager
def socket_daemon(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    tokens = tmp_path / "tokens.yaml"
    token = add_token(tokens, "dora")
    with unix_socket_daemon(tmp_path, env={"SANDBOXD_TOKENS_FILE": str(tokens)}) as sock:
        yield sock, token


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_mcp_on_the_unix_socket(tmp_path: Path, transport: str) -> None:
    with socket_daemon(tmp_path) as (sock, token):
        if transport == "http":
            # the daemon loads the MCP SDK on its first /mcp request: seconds on a loaded
            # machine, past httpx's 5 s default (what is tested is the socket, not the speed)
            http = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(sock)),
                                      headers={"Authorization": f"Bearer {token}"},
                                      timeout=60)
            async with (http,
                        streamable_http_client("http://sandboxd/mcp", http_client=http)
                        as (read, write),
                        ClientSession(read, write) as session):
                await session.initialize()
                result = await session.call_tool("python", {"code": "print(6*7)"})
        else:
            token_file = tmp_path / "dora.token"
            token_file.write_text(token)
            params = bridge_params("http://unused", token_file)
            params.args = ["-m", "sandboxd", "mcp", "--socket", str(sock),
                           "--token-file", str(token_file)]
            from mcp.client.stdio import stdio_client

            async with (stdio_client(params) as (read, write),
                        ClientSession(read, write) as session):
                await session.initialize()
                result = await session.call_tool("python", {"code": "print(6*7)"})
    assert result.is_error is False and text_of(result).strip() == "42"
