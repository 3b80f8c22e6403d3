"""``sandboxd token add NAME`` / ``list`` / ``remove NAME``."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)

DEFAULT_TOKENS_FILE = Path("/etc/sandboxd/tokens.yaml")


def _tokens_file(path: Path | None) -> Path:
    if path is not None:
        return path
    from sandboxd.config import load_settings

    try:
        configured = load_settings().tokens_file
    except Exception as exc:
        typer.echo(f"sandboxd: cannot load settings: {exc}", err=True)
        raise typer.Exit(2) from None
    return configured or DEFAULT_TOKENS_FILE


_FILE_OPTION = typer.Option(None, "--tokens-file", help="Tokens file (default: settings, else "
                            f"{DEFAULT_TOKENS_FILE})")


@app.command("add")
def add(name: str = typer.Argument(..., help="Client name"),
        tokens_file: Path | None = _FILE_OPTION) -> None:
    """Create a token for a client: prints it once; only its SHA-256 is stored."""
    from sandboxd.auth import TokenFileError, add_token

    path = _tokens_file(tokens_file)
    try:
        token = add_token(path, name)
    except (TokenFileError, OSError) as exc:
        typer.echo(f"sandboxd: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"token for client '{name}' added to {path} (shown once, store it now):",
               err=True)
    typer.echo(token)


@app.command("list")
def list_(tokens_file: Path | None = _FILE_OPTION) -> None:
    """List clients and token hash prefixes (tokens themselves are never stored)."""
    from sandboxd.auth import TokenFileError, TokenStore

    path = _tokens_file(tokens_file)
    try:
        store = TokenStore.load(path)
    except TokenFileError as exc:
        typer.echo(f"sandboxd: {exc}", err=True)
        raise typer.Exit(1) from None
    for entry in store.entries:
        typer.echo(f"{entry.client:<24} sha256:{entry.sha256[:12]}…  {entry.created or ''}")


@app.command("remove")
def remove(name: str = typer.Argument(..., help="Client name"),
           tokens_file: Path | None = _FILE_OPTION) -> None:
    """Remove every token of a client."""
    from sandboxd.auth import TokenFileError, remove_tokens

    path = _tokens_file(tokens_file)
    try:
        removed = remove_tokens(path, name)
    except (TokenFileError, OSError) as exc:
        typer.echo(f"sandboxd: {exc}", err=True)
        raise typer.Exit(1) from None
    if not removed:
        typer.echo(f"sandboxd: no token for client '{name}' in {path}", err=True)
        raise typer.Exit(1)
    typer.echo(f"removed {removed} token(s) of client '{name}' from {path}")
