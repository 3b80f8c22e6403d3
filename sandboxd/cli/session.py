"""``sandboxd session create|list|show|fork|restart|delete``: the caller's sessions on a running
daemon (same ``--url`` / ``--token`` as ``sandboxd invoke``). Human output by default,
``--json`` for the daemon's own JSON; a failure is one line on stderr, exit 1."""

from __future__ import annotations

import json
import time
from typing import Any

import typer

from sandboxd.cli.daemon import TOKEN_OPTION, URL_OPTION, _call

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None)
JSON_OPTION = typer.Option(False, "--json", help="Print the daemon's JSON")


def _raw(info: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(info).items() if v is not None}


def _kernel(info: Any) -> str:
    backends = (info.kernel or {}).get("backends") or []
    state = f"live ({', '.join(backends)})" if backends else "none"
    return state + (", paused (idle)" if getattr(info, "paused", False) else "")


def _line(info: Any) -> str:
    left = max(0, int(float(info.expires_at or 0) - time.time()))
    return (f"{info.id}  {info.workspace_bytes or 0} bytes  expires in {left} s  "
            f"kernel {_kernel(info)}")


def _show(info: Any, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(_raw(info), indent=2))
        return
    typer.echo(f"id:         {info.id}")
    for label, value in (("created", info.created_at), ("expires", info.expires_at)):
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(value or 0)))
        typer.echo(f"{label + ':':<11} {when}")
    typer.echo(f"workspace:  {info.workspace_bytes or 0} of {info.quota_bytes} bytes, "
               f"{info.workspace_entries or 0} of {info.quota_entries} entries")
    typer.echo(f"kernel:     {_kernel(info)}")


@app.command("create")
def create(ttl: float | None = typer.Option(None, "--ttl", min=1, help="Seconds (sliding)"),
           url: str = URL_OPTION, token: str | None = TOKEN_OPTION,
           as_json: bool = JSON_OPTION) -> None:
    """Create a session; prints its id (use it with `sandboxd invoke --session`)."""
    info = _call(url, token, lambda c: c.create_session(ttl))
    typer.echo(json.dumps(_raw(info), indent=2) if as_json else info.id)


@app.command("list")
def list_(url: str = URL_OPTION, token: str | None = TOKEN_OPTION,
          as_json: bool = JSON_OPTION) -> None:
    """Your sessions, oldest first: id, workspace bytes, expiry, kernel."""
    infos = _call(url, token, lambda c: c.sessions())
    if as_json:
        typer.echo(json.dumps([_raw(i) for i in infos], indent=2))
        return
    for info in infos:
        typer.echo(_line(info))


@app.command("show")
def show(session_id: str = typer.Argument(..., metavar="ID"), url: str = URL_OPTION,
         token: str | None = TOKEN_OPTION, as_json: bool = JSON_OPTION) -> None:
    """One session: expiry, workspace usage, kernel state."""
    _show(_call(url, token, lambda c: c.get_session(session_id)), as_json)


def _action(info: Any, as_json: bool, backends: list[str] | None, done: str,
            none: str) -> None:
    """Print what a session action did: the backends it reached, or that there was none."""
    if as_json:
        typer.echo(json.dumps(_raw(info), indent=2))
    else:
        typer.echo(f"{info.id}: {done} ({', '.join(backends)})" if backends
                   else f"{info.id}: {none}")


@app.command("fork")
def fork(session_id: str = typer.Argument(..., metavar="ID"),
         count: int = typer.Option(1, "--count", "-n", min=1, help="Forks to make"),
         url: str = URL_OPTION, token: str | None = TOKEN_OPTION,
         as_json: bool = JSON_OPTION) -> None:
    """New sessions with a copy of this one's files and Python state (one id a line); what
    was not carried is noted on stderr."""
    made = _call(url, token, lambda c: c.fork_session(session_id, count))
    if as_json:
        typer.echo(json.dumps(_fork_document(made), indent=2))
        return
    for info in made.sessions:
        typer.echo(info.id)
    if not made.kernel_carried:
        typer.echo(f"note: {made.kernel_reason}", err=True)
    for name, why in made.not_carried.items():
        typer.echo(f"note: {name} was not carried ({why})", err=True)


def _fork_document(made: Any) -> dict[str, Any]:
    """``fork --json``: the parent, the new sessions, what of the kernel was carried."""
    return {"parent": made.parent, "sessions": [_raw(i) for i in made.sessions],
            "kernel": {"carried": made.kernel_carried, "reason": made.kernel_reason,
                       "not_carried": made.not_carried}}


@app.command("restart")
def restart(session_id: str = typer.Argument(..., metavar="ID"), url: str = URL_OPTION,
            token: str | None = TOKEN_OPTION, as_json: bool = JSON_OPTION) -> None:
    """End the session's Python kernel (its variables); the files stay."""
    info = _call(url, token, lambda c: c.restart_session(session_id))
    _action(info, as_json, info.restarted, "kernel ended", "no live kernel to end")


@app.command("interrupt")
def interrupt(session_id: str = typer.Argument(..., metavar="ID"), url: str = URL_OPTION,
              token: str | None = TOKEN_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Interrupt the call running in the session (KeyboardInterrupt); variables are kept."""
    info = _call(url, token, lambda c: c.interrupt_session(session_id))
    _action(info, as_json, info.interrupted, "call interrupted", "no call was running")


@app.command("delete")
def delete(session_id: str = typer.Argument(..., metavar="ID"), url: str = URL_OPTION,
           token: str | None = TOKEN_OPTION) -> None:
    """Delete a session, its kernel and its workspace."""
    _call(url, token, lambda c: c.delete_session(session_id))
    typer.echo(f"{session_id}: deleted")
