"""``sandboxd token add NAME`` / ``list`` / ``remove NAME`` / ``remove --id ID``."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sandboxd.cli.common import CONFIG_OPTION, fail, settings_for

if TYPE_CHECKING:
    from sandboxd.access.tokens import TokenEntry

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)

DEFAULT_TOKENS_FILE = Path("/etc/sandboxd/tokens.yaml")
_DURATION = re.compile(r"^(\d+)([mhdw])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def _tokens_file(path: Path | None, config: Path | None) -> Path:
    if path is not None:
        return path
    return settings_for(config, None).tokens_file or DEFAULT_TOKENS_FILE


def parse_expiry(text: str, now: datetime | None = None) -> datetime:
    """``30d``, ``12h``, ``90m``, ``2w`` from now, or an ISO 8601 date/time (UTC unless an
    offset is given); ValueError with a readable message otherwise."""
    from sandboxd.access.tokens import parse_time

    match = _DURATION.match(text.strip())
    if match:
        amount, unit = int(match.group(1)), match.group(2)
        if amount <= 0:
            raise ValueError(f"--expires {text!r}: the duration must be positive")
        return (now or datetime.now(UTC)) + timedelta(**{_UNITS[unit]: amount})
    try:
        return parse_time(text.strip())
    except ValueError:
        raise ValueError(f"--expires {text!r}: give a duration (30d, 12h, 90m, 2w) or an ISO "
                         "8601 time (2027-01-31 or 2027-01-31T12:00:00Z)") from None


_FILE_OPTION = typer.Option(None, "--tokens-file", help="Tokens file (default: the daemon's "
                            f"tokens_file setting, else {DEFAULT_TOKENS_FILE})")


@app.command("add")
def add(name: str = typer.Argument(..., help="Client name"),
        label: str | None = typer.Option(None, "--label", help="What the token is for"),
        expires: str | None = typer.Option(
            None, "--expires", help="Expiry: a duration (30d, 12h) or an ISO 8601 time"),
        role: str | None = typer.Option(
            None, "--role", help="approvers: may decide any pending approval (docs/api.md)"),
        tokens_file: Path | None = _FILE_OPTION,
        config: Path | None = CONFIG_OPTION) -> None:
    """Create a token for a client: prints it once; only its SHA-256 is stored."""
    from sandboxd.access.tokens import TokenFileError, add_token

    try:
        expiry = parse_expiry(expires) if expires is not None else None
    except ValueError as exc:
        fail(str(exc))
        return
    path = _tokens_file(tokens_file, config)
    try:
        token = add_token(path, name, label=label, expires=expiry, role=role)
    except (TokenFileError, OSError) as exc:
        fail(str(exc), 1)
        return
    until = f", expires {expiry.isoformat(timespec='seconds')}" if expiry else ""
    typer.echo(f"token for client '{name}' added to {path}{until} (shown once, store it now):",
               err=True)
    typer.echo(token)


@app.command("list")
def list_(tokens_file: Path | None = _FILE_OPTION,
          config: Path | None = CONFIG_OPTION) -> None:
    """List tokens: client, id (hash prefix; tokens themselves are never stored), created,
    label, expiry."""
    from sandboxd.access.tokens import TokenFileError, TokenStore

    path = _tokens_file(tokens_file, config)
    try:
        store = TokenStore.load(path)
    except TokenFileError as exc:
        fail(str(exc), 1)
        return
    if not store.entries:
        typer.echo(f"no tokens in {path}", err=True)
        return
    typer.echo(f"{'CLIENT':<20} {'ID':<12}  {'CREATED':<20}  {'EXPIRES':<28}  LABEL")
    for entry in store.entries:
        typer.echo(_row(entry))


def _row(entry: TokenEntry) -> str:
    """One token's line of ``token list``."""
    expiry = (entry.expires or "never") + (" (EXPIRED)" if entry.expired() else "")
    return (f"{entry.client:<20} {entry.id:<12}  {entry.created or '-':<20}  "
            f"{expiry:<28}  {entry.label or ''}".rstrip())


@app.command("remove")
def remove(name: str | None = typer.Argument(None, help="Client name: remove all its tokens"),
           token_id: str | None = typer.Option(
               None, "--id", help="Remove only the token with this id (hash prefix from "
               "`token list`)"),
           tokens_file: Path | None = _FILE_OPTION,
           config: Path | None = CONFIG_OPTION) -> None:
    """Revoke tokens: every token of a client, or one token by its id. The daemon stops
    accepting them within a second, without a restart."""
    from sandboxd.access.tokens import TokenFileError

    if (name is None) == (token_id is None):
        fail("give a client name or --id ID (not both)")
    path = _tokens_file(tokens_file, config)
    try:
        done = _revoke(path, name, token_id)
    except (TokenFileError, OSError) as exc:
        fail(str(exc), 1)
        return
    typer.echo(done)


def _revoke(path: Path, name: str | None, token_id: str | None) -> str:
    """Revoke the token ``token_id``, else every token of client ``name``; what was done,
    as one line (TokenFileError when nothing matched)."""
    from sandboxd.access.tokens import TokenFileError, remove_token_by_id, remove_tokens

    if token_id is not None:
        entry = remove_token_by_id(path, token_id)
        label = f" ({entry.label})" if entry.label else ""
        return f"removed token {entry.id} of client '{entry.client}'{label} from {path}"
    assert name is not None
    removed = remove_tokens(path, name)
    if not removed:
        raise TokenFileError(f"no token for client '{name}' in {path}")
    return f"removed {removed} token(s) of client '{name}' from {path}"
