"""``sandboxd policy replay`` and ``sandboxd policy suggest``: policies tried on the audit log
(:mod:`sandboxd.policy.replay`, :mod:`sandboxd.policy.suggest`)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from sandboxd.cli.common import (
    CONFIG_OPTION,
    loaded_offline_service,
    loaded_policy_store,
    settings_policies_dir,
)
from sandboxd.util.text import visible

if TYPE_CHECKING:
    from sandboxd.models import Decision, LimitsRequest
    from sandboxd.policy import PolicyStore
    from sandboxd.policy.replay import Change, Replay

#: exit status: nothing changes / something changes / bad input / nothing changes among the
#: calls re-decided, but some could not be
EXIT_SAME, EXIT_CHANGED, EXIT_BAD, EXIT_UNDECIDABLE = 0, 1, 2, 3

_AUDIT = typer.Option(..., "--audit", help="Audit log file, or the directory holding it "
                                           "(rotated files are read too)")


def policies_or_settings(policies: Path | None, config: Path | None) -> Path | None:
    """The policies directory ``--policies`` names, else the settings' (None: the embedded
    default)."""
    return policies if policies is not None else settings_policies_dir(config)


def _fail(line: str) -> typer.Exit:
    typer.echo(f"sandboxd: {line}", err=True)
    return typer.Exit(EXIT_BAD)


def _records(audit: Path, client: str | None) -> Iterator[dict[str, Any]]:
    """The log's decision records, read as they are used (a log can be gigabytes); a path
    that names no log fails here, before anything is read."""
    from sandboxd.policy.replay import AuditPathError, audit_log_path, decision_records

    try:
        return decision_records(audit_log_path(audit), client)
    except AuditPathError as exc:
        raise _fail(str(exc)) from None


def _warn_unverified(audit: Path) -> None:
    """A log whose hash chain breaks is replayed as it stands, with a warning: its records
    may not be the calls that were made."""
    from sandboxd.audit import verify
    from sandboxd.policy.replay import audit_log_path

    report = verify(audit_log_path(audit))
    if not report.ok:
        typer.echo(visible(f"sandboxd: warning: the audit log does not verify, its records "
                           f"may have been altered: {report.first_bad}"), err=True)


def _decider(policies: Path | None, config: Path | None) -> Any:
    """The daemon's own decision for a call (tool lookup, argument schema, policy), from the
    policies in ``policies`` (else the settings', else the embedded default)."""
    from sandboxd.models import Decision
    from sandboxd.tools import ArgumentsInvalid

    service = loaded_offline_service(policies_or_settings(policies, config), EXIT_BAD)

    def decide(client: str, tool: str, arguments: dict[str, Any],
               requested: LimitsRequest | None) -> Decision:
        try:
            return service.explain(client, tool, arguments, requested,
                                   unknown_tool_denied=True).decision
        except ArgumentsInvalid as exc:  # refused before any policy rule: the tool's schema
            return Decision(allowed=False, source="(tool parameters)", rule="parameters",
                            message=f"invalid arguments: {exc}")

    return decide


def _print(result: Replay, audit: Path) -> None:
    """The outcome as a person reads it: the counts, the changes by kind, the tallies."""
    from sandboxd.policy.replay import KINDS

    counts = ", ".join(f"{result.count(k)} {k}" for k in KINDS)
    typer.echo(f"{result.calls} decided call(s) in {audit}: {counts}, "
               f"{result.unchanged} unchanged")
    for kind in KINDS:
        _print_kind(kind, [c for c in result.changes if c.kind == kind])
    if result.changes:
        _print_tallies(result)


def _print_kind(kind: str, changes: list[Change]) -> None:
    """The changes of one kind under a ``kind:`` heading, a line each (nothing when none)."""
    if changes:
        typer.echo(f"\n{kind}:")
    for c in changes:
        typer.echo(visible(f"  {c.request_id}  client={c.client}  tool={c.tool}  "
                           f"{_change_text(c)}"))


def _change_text(change: Change) -> str:
    """A changed decision: its rule now, the rule before, and what changed (an undecidable
    call: why)."""
    from sandboxd.policy.replay import UNDECIDABLE

    if change.kind == UNDECIDABLE:
        return change.rule
    return f"{change.rule} (was {change.was_rule})" + (f": {change.detail}" if change.detail
                                                       else "")


def _print_tallies(result: Replay) -> None:
    """The changes counted by rule and by client."""
    typer.echo("\nby rule:")
    for (kind, rule), n in sorted(result.by_rule().items()):
        typer.echo(visible(f"  {n:>5}  {kind}  {rule}"))
    typer.echo("\nby client:")
    for (client, kind), n in sorted(result.by_client().items()):
        typer.echo(visible(f"  {n:>5}  {kind}  {client}"))


def replay_cmd(
    audit: Path = _AUDIT,
    policies: Path | None = typer.Option(
        None, "--policies", help="Policies to try (default: settings, else embedded)"),
    client: str | None = typer.Option(None, "--client", help="Only this client's calls"),
    as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON"),
    config: Path | None = CONFIG_OPTION,
) -> None:
    """Decide every call of the audit log again under other policies; print what changes.

    Exit 0 when nothing changes, 1 when a decision or its limits change, 2 for bad input,
    3 when nothing changes among the calls re-decided but some could not be (their
    arguments were cut or redacted in the log)."""
    from sandboxd.policy.replay import replay

    records = _records(audit, client)
    _warn_unverified(audit)
    result = replay(records, _decider(policies, config))
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2, ensure_ascii=False))
    else:
        _print(result, audit)
    if result.changed:
        raise typer.Exit(EXIT_CHANGED)
    if result.changes:
        raise typer.Exit(EXIT_UNDECIDABLE)


def suggest_cmd(
    audit: Path = _AUDIT,
    client: str = typer.Option(..., "--client", help="The client to write a policy for"),
    output: Path | None = typer.Option(None, "--output", "-o",
                                       help="Write the policy here (default: stdout)"),
    policies: Path | None = typer.Option(
        None, "--policies", help="Policies in force, for the definitions of admin-defined "
                                 "tools (default: settings, else embedded)"),
    config: Path | None = CONFIG_OPTION,
) -> None:
    """Write a least-privilege policy for a client: what its allowed calls in the audit log
    used, with the largest limits they got. It is checked before it is written: it loads,
    and every allowed call of the client replays under it as allowed with its limits."""
    from sandboxd.policy.suggest import suggest

    records = list(_records(audit, client))  # read twice: for the policy, for its check
    if not records:
        raise _fail(f"{audit}: no decided calls of client {visible(client)!r}")
    definitions = _definitions(records, client, policies_or_settings(policies, config))
    text = suggest(records, client, audit=str(audit), definitions=definitions)
    _check_suggestion(text, records, set(definitions))
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
    typer.echo(f"checked: every allowed call of {visible(client)} that the log holds whole "
               "replays allowed under it, with its limits", err=True)


def _definitions(records: list[dict[str, Any]], client: str,
                 policies: Path | None) -> dict[str, str]:
    """The definitions in force (in ``policies``) of the admin-defined tools the client's
    calls used, by name: the suggestion copies them."""
    from sandboxd.policy.suggest import SUGGESTED, custom_definition

    pol = loaded_policy_store(policies, EXIT_BAD).policy_for(client)
    used = {str(r.get("tool")) for r in records} - set(SUGGESTED)
    return {t: d for t in used if (d := custom_definition(pol, t)) is not None}


def _suggested_store(directory: Path, text: str) -> PolicyStore:
    """The suggested policy ``text``, written in ``directory`` and loaded (exit 1 when it does
    not load: a bug here, not the admin's, said whole)."""
    from sandboxd.policy import PolicyError, PolicyStore

    (directory / "suggested.yaml").write_text(text, encoding="utf-8")
    store = PolicyStore(directory)
    try:
        store.load()
    except PolicyError as exc:
        for line in exc.problems:
            typer.echo(f"sandboxd: the suggested policy does not load: {line}", err=True)
        raise typer.Exit(1) from None
    return store


def _check_suggestion(text: str, records: list[dict[str, Any]], defined: set[str]) -> None:
    """Exit 1 unless the suggested policy ``text`` loads and every call of ``records`` it
    covers (a built-in tool's, or an admin-defined one whose definition it copied) replays
    under it as allowed with its limits."""
    from sandboxd.policy.replay import DENIED_ALLOWED, UNDECIDABLE, replay
    from sandboxd.policy.suggest import SUGGESTED

    with tempfile.TemporaryDirectory(prefix="sandboxd-suggest-") as tmp:
        check = replay(records, _suggested_store(Path(tmp), text).decide)
    # (calls of admin-defined tools it could not copy are left to the admin: it says so)
    covered = {*SUGGESTED, *defined}
    refused = [c for c in check.changes
               if c.kind not in (DENIED_ALLOWED, UNDECIDABLE) and c.tool in covered]
    for c in refused:
        typer.echo(visible(f"sandboxd: the suggested policy changes {c.request_id} "
                           f"({c.kind}: {c.rule} {c.detail})"), err=True)
    if refused:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``replay`` and ``suggest`` to the ``policy`` group's ``app``."""
    app.command("replay")(replay_cmd)
    app.command("suggest")(suggest_cmd)
