"""The MCP front door on the daemon's unix socket: the SDK's client over Streamable HTTP on the
socket, and the stdio bridge with ``--socket``."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from sandboxd.tokens import add_token
from tests.mcp.conftest import bridge_params
from tests.mcp.test_mcp import text_of


@contextlib.contextmanager
def socket_daemon(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    sock = tmp_path / "sandboxd.sock"
    tokens = tmp_path / "tokens.yaml"
    token = add_token(tokens, "dora")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    env.update(SANDBOXD_CONFIG=os.devnull, SANDBOXD_TOKENS_FILE=str(tokens))
    log_path = tmp_path / "uds.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sandboxd", "serve", "--uds", str(sock),
             "--state-dir", str(tmp_path / "state")],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        http = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://x")
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "daemon did not come up on the socket"
            with contextlib.suppress(httpx.HTTPError):
                if http.get("/healthz").status_code == 200:
                    break
            time.sleep(0.1)
        http.close()
        yield sock, token
    finally:
        proc.terminate()
        proc.wait(60)


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_mcp_on_the_unix_socket(tmp_path: Path, transport: str) -> None:
    with socket_daemon(tmp_path) as (sock, token):
        if transport == "http":
            http = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(uds=str(sock)),
                                      headers={"Authorization": f"Bearer {token}"})
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
