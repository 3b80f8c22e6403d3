"""``sandboxd approvals list|approve|deny``: the gated calls waiting for you, and your answer
(same ``--url`` / ``--token`` as ``sandboxd invoke``; docs/api.md, "Approvals"). A failure
(not an approver: HTTP 403, nothing waits under that id: HTTP 404) is one line, exit 1."""

from __future__ import annotations

import json
from typing import Any

import typer

from sandboxd.cli.daemon import TOKEN_OPTION, URL_OPTION, _call
from sandboxd.util.text import visible

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None)
JSON_OPTION = typer.Option(False, "--json", help="Print the daemon's JSON")
REASON_OPTION = typer.Option(None, "--reason", help="Why (the caller and the audit log see it)")


@app.command("list")
def list_(url: str = URL_OPTION, token: str | None = TOKEN_OPTION,
          as_json: bool = JSON_OPTION) -> None:
    """The calls waiting for your approval: id, client, tool, session, rule, arguments."""
    pending = _call(url, token, lambda c: c.request("GET", "/v1/approvals").json())
    if as_json:
        typer.echo(json.dumps(pending, indent=2))
        return
    for p in pending:
        # a caller's arguments are hostile text: shown escaped, on one line
        typer.echo(visible(
            f"{p['id']}  client={p['client']}  tool={p['tool']}  "
            f"session={p['session'] or '-'}  rule={p['rule']}  until={p['expires_at']}  "
            f"arguments={json.dumps(p['arguments'], ensure_ascii=False)}"))


def _decide(approval_id: str, body: dict[str, Any], url: str, token: str | None) -> None:
    answer = _call(url, token, lambda c: c.request(
        "POST", f"/v1/approvals/{approval_id}", json=body).json())
    scope = (f" for this session, {body['minutes']:g} min" if answer.get("scope") == "session"
             else "")
    typer.echo(f"{answer['id']}: {answer['state']} by {answer['by']}{scope}")


@app.command("approve")
def approve(approval_id: str = typer.Argument(..., metavar="ID"),
            session_minutes: float | None = typer.Option(
                None, "--session-minutes", min=1,
                help="Also let the same rule's later calls of that session run for this long"),
            reason: str | None = REASON_OPTION, url: str = URL_OPTION,
            token: str | None = TOKEN_OPTION) -> None:
    """Let one waiting call run (or, with --session-minutes, its session's matching calls)."""
    body: dict[str, Any] = {"decision": "approve", "reason": reason}
    if session_minutes is not None:
        body.update(scope="session", minutes=session_minutes)
    _decide(approval_id, body, url, token)


@app.command("deny")
def deny(approval_id: str = typer.Argument(..., metavar="ID"),
         reason: str | None = REASON_OPTION, url: str = URL_OPTION,
         token: str | None = TOKEN_OPTION) -> None:
    """Refuse one waiting call: it does not run, and its caller reads why."""
    _decide(approval_id, {"decision": "deny", "reason": reason}, url, token)
