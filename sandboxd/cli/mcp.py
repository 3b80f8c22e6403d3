"""``sandboxd mcp``: the stdio bridge for MCP hosts that launch servers as subprocesses.

It speaks MCP on stdin/stdout and forwards every JSON-RPC message, unchanged, to a running
daemon's Streamable HTTP endpoint (``/mcp``), and every message of the daemon back
(:mod:`sandboxd.cli.mcp_bridge`, in both protocol eras the door speaks). It executes nothing and
interprets nothing: the daemon's MCP front door is the one MCP server, so the bridge cannot
drift from it.

When stdin closes, or on SIGTERM/SIGINT, the bridge ends the MCP session (HTTP DELETE), so the
daemon deletes the session's workspace, and exits (tests/mcp/test_bridge_exit.py). It answers a
host's first request within a second of its start: it loads neither the MCP SDK nor the rest
of the CLI (bench/bench_mcp_bridge.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from sandboxd import DEFAULT_URL


def _say(message: str) -> None:
    from sandboxd.cli.mcp_bridge import say

    say(message)


def _read_token(token: str | None, token_file: Path | None) -> str | None:
    if token_file is None:
        return token
    try:
        text = token_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        _say(f"{token_file}: cannot read the token file: {exc.strerror or exc}")
        raise typer.Exit(2) from exc
    if text.split() != [text]:  # empty, or whitespace inside: not one token
        _say(f"{token_file}:1: the token file must hold one token on one line")
        raise typer.Exit(2)
    return text


def _endpoint(url: str, socket: Path | None) -> tuple[str, str | None]:
    """(the /mcp URL, the unix socket or None)."""
    if url.startswith("unix:"):
        socket, url = Path(url[len("unix:"):]), "http://sandboxd"
    elif socket is not None:
        url = "http://sandboxd"  # over a unix socket the host part is only the Host header
    base = url.rstrip("/").removesuffix("/mcp")
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
    import asyncio

    from sandboxd.cli import mcp_bridge

    secret = _read_token(token, token_file)
    endpoint, uds = _endpoint(url, socket)
    code = asyncio.run(mcp_bridge.run(endpoint, uds, secret))
    raise typer.Exit(code)


def standalone(args: list[str]) -> None:
    """``sandboxd mcp ARGS`` without the rest of the CLI: a host waits for the bridge's first
    answer, and the other commands' imports (pydantic models, settings) cost it 0.2 s."""
    one = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                      rich_markup_mode=None)
    one.command(name="mcp")(mcp)
    one(args=args, prog_name="sandboxd mcp")


def register(app: typer.Typer) -> None:
    """Add ``mcp`` to the main app."""
    app.command(name="mcp")(mcp)
