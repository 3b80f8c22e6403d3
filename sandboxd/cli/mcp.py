"""``sandboxd mcp``: the stdio bridge for MCP hosts that launch servers as subprocesses.

It speaks MCP on stdin/stdout and forwards every JSON-RPC message, unchanged, to a running
daemon's Streamable HTTP endpoint (``/mcp``), and every message of the daemon back. It executes
nothing and interprets nothing: the daemon's MCP front door is the one MCP server (auth, tool
lists, results, sessions, progress, cancellation, list_changed), so the bridge cannot drift from
it. It is a message pump between the SDK's stdio server transport and its Streamable HTTP client
transport, not an MCP server of its own: a proxy that re-implemented ``tools/call`` on top of
:class:`~sandboxd.client.SandboxClient` would be a second mapping of results to MCP.

When stdin closes, or on SIGTERM/SIGINT, the bridge ends the MCP session (HTTP DELETE), so the
daemon deletes the session's workspace, and exits (0.2-0.3 s, tests/mcp/test_bridge_exit.py).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import typer

from sandboxd import DEFAULT_URL

EXIT_AUTH = 3


def _say(message: str) -> None:
    """One line on stderr (an MCP host shows a server's stderr in its logs)."""
    sys.stderr.write(f"sandboxd mcp: {message}\n")
    sys.stderr.flush()


def _read_token(token: str | None, token_file: Path | None) -> str | None:
    if token_file is None:
        return token
    try:
        text = token_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        _say(f"{token_file}: cannot read the token file: {exc.strerror or exc}")
        raise typer.Exit(2) from exc
    if not text or any(c.isspace() for c in text):
        _say(f"{token_file}:1: the token file must hold one token on one line")
        raise typer.Exit(2)
    return text


def _endpoint(url: str, socket: Path | None) -> tuple[str, str | None]:
    """(the /mcp URL, the unix socket or None)."""
    if url.startswith("unix:"):
        socket, url = Path(url[len("unix:"):]), "http://sandboxd"
    elif socket is not None:
        url = "http://sandboxd"  # over a unix socket the host part is only the Host header
    base = url.rstrip("/")
    if base.endswith("/mcp"):
        base = base[: -len("/mcp")]
    return f"{base}/mcp", os.fspath(socket) if socket is not None else None


def mcp(
    url: str = typer.Option(DEFAULT_URL, "--url", envvar="SANDBOXD_URL",
                            help="Daemon URL (or unix:/path/to.sock)"),
    socket: Path | None = typer.Option(None, "--socket", envvar="SANDBOXD_SOCKET",
                                       help="The daemon's unix socket (instead of --url)"),
    token: str | None = typer.Option(None, "--token", envvar="SANDBOXD_TOKEN",
                                     help="Bearer token (prefer --token-file)"),
    token_file: Path | None = typer.Option(None, "--token-file", envvar="SANDBOXD_TOKEN_FILE",
                                           help="File holding the bearer token"),
) -> None:
    """Speak MCP on stdin/stdout, forwarding to a running daemon (for MCP hosts)."""
    import anyio

    secret = _read_token(token, token_file)
    endpoint, uds = _endpoint(url, socket)
    code = anyio.run(_bridge, endpoint, uds, secret)
    raise typer.Exit(code)


async def _bridge(endpoint: str, uds: str | None, token: str | None) -> int:
    import signal

    import anyio
    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.stdio import stdio_server

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx2.AsyncHTTPTransport(uds=uds) if uds else None
    # no read timeout: a call's notification stream may be quiet for as long as its deadline
    timeout = httpx2.Timeout(30.0, read=None)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout, transport=transport) as http:
        problem = await _preflight(http, endpoint)
        if problem is not None:
            _say(problem)
            return EXIT_AUTH if "401" in problem else 1
        stdin = await _Stdin.open()
        async with stdio_server(stdin=stdin) as (host_in, host_out):  # type: ignore[arg-type]
            try:
                async with (streamable_http_client(endpoint, http_client=http)
                            as (daemon_in, daemon_out), anyio.create_task_group() as tg):

                    async def pump(source: object, sink: object, name: str) -> None:
                        async for message in source:  # type: ignore[attr-defined]
                            if isinstance(message, Exception):  # bad line, broken stream
                                _say(f"{name}: {message}")
                                continue
                            await sink.send(message)  # type: ignore[attr-defined]
                        tg.cancel_scope.cancel()  # either side closed: the bridge ends

                    async def stop_on_signal() -> None:
                        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                            async for _ in signals:
                                tg.cancel_scope.cancel()  # as if stdin closed: DELETE, exit
                                return

                    tg.start_soon(pump, host_in, daemon_out, "from the host")
                    tg.start_soon(pump, daemon_in, host_out, "from the daemon")
                    tg.start_soon(stop_on_signal)
            finally:
                # the SDK's stdio transport ends when its streams do: the writer when the
                # stream it drains is closed, the reader at the end of stdin (ended here too,
                # when the daemon's side or a signal ended the bridge first)
                stdin.close()
                await host_out.aclose()
    return 0


class _Stdin:
    """The host's lines on fd 0, read by the event loop (no thread), for the SDK's stdio
    transport: ``close()`` ends them at once, where a thread blocked in ``read`` would hold
    the bridge until the host wrote or closed its end."""

    LIMIT = 64 * 2**20  # a line longer than any request body the daemon takes

    def __init__(self, reader: asyncio.StreamReader | None) -> None:
        self.reader = reader

    @classmethod
    async def open(cls) -> _Stdin:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=cls.LIMIT)
        try:
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        except (ValueError, OSError):  # a regular file: the loop cannot watch it; read it whole
            reader.feed_data(sys.stdin.buffer.read())
            reader.feed_eof()
        return cls(reader)

    def close(self) -> None:
        if self.reader is not None and not self.reader.at_eof():
            self.reader.feed_eof()

    async def __aiter__(self) -> AsyncIterator[str]:
        assert self.reader is not None
        while True:
            try:
                line = await self.reader.readline()
            except (asyncio.LimitOverrunError, ValueError):
                _say(f"from the host: a line over {self.LIMIT} bytes, dropped")
                continue
            if not line:
                return
            yield line.decode("utf-8", errors="replace")


async def _preflight(http: object, endpoint: str) -> str | None:
    """A clear line for the host's log when the daemon is unreachable or refuses the token
    (otherwise the host only sees its initialize request fail)."""
    import httpx2

    base = endpoint[: -len("/mcp")]
    try:
        response = await http.get(f"{base}/v1/tools")  # type: ignore[attr-defined]
    except httpx2.HTTPError as exc:
        return f"cannot reach the daemon at {base}: {exc}"
    if response.status_code == 401:
        return (f"the daemon at {base} refused the token (HTTP 401): give the token of a "
                "client (`sandboxd token add NAME`) with --token-file")
    if response.status_code >= 400:
        return f"the daemon at {base} answered HTTP {response.status_code}: {response.text[:200]}"
    return None


def register(app: typer.Typer) -> None:
    """Add ``mcp`` to the main app."""
    app.command(name="mcp")(mcp)
