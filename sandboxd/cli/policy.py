"""``sandboxd policy check FILE...`` and ``sandboxd policy explain``."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from sandboxd.cli.common import CONFIG_OPTION, loaded_offline_service, loaded_policy_store
from sandboxd.cli.policy_replay import policies_or_settings
from sandboxd.cli.policy_replay import register as _register_replay

if TYPE_CHECKING:
    from sandboxd.models import Decision, LimitsRequest, ToolSpec
    from sandboxd.policy import LoadedPolicy
    from sandboxd.protocol.limits import Limits

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None)


@app.command("check")
def check(
    files: list[Path] = typer.Argument(..., help="Policy files or directories of policy files"),
    separately: bool = typer.Option(
        False, "--separately", help="Check each file on its own (not as one policy set)"),
    strict: bool = typer.Option(False, "--strict", help="Treat warnings as problems"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No warnings, no 'ok' lines"),
) -> None:
    """Validate policy files. Exit 1 with one `file:line:column: message` line per problem.

    Warnings (valid but risky settings, such as an interpreter in the shell allowlist) go to
    stderr as `file:line:column: warning: ...`; with --strict they are problems.

    The files (and the *.yaml/*.yml files of each directory) are checked as one policy set,
    as the daemon would load them together: names and client assignments must not clash.
    """
    from sandboxd.policy.engine import policy_warnings

    problems: list[str] = []
    groups = _check_groups(files, problems)
    if not separately:
        groups = [list(itertools.chain.from_iterable(groups))]
    loaded = _check_load(groups, problems)
    warnings = [w for pol in loaded for w in policy_warnings(pol)]
    _report(problems + warnings if strict else problems, [] if strict or quiet else warnings)
    if not quiet:
        _print_ok(loaded)


def _report(problems: list[str], warnings: list[str]) -> None:
    """The problems on stdout, then the warnings on stderr; exit 1 if there is a problem."""
    for line in problems:
        typer.echo(line)
    for line in warnings:
        typer.echo(line, err=True)
    if problems:
        raise typer.Exit(1)


def _print_ok(loaded: list[LoadedPolicy]) -> None:
    """An ``ok`` line per policy that passed: its clients and the tools it enables."""
    from sandboxd.policy.specs import enabled_tools

    for pol in loaded:
        typer.echo(f"{pol.source}: ok (policy '{pol.name}'; clients: "
                   f"{', '.join(pol.spec.clients)}; tools: "
                   f"{', '.join(enabled_tools(pol)) or 'none'})")


def _check_groups(files: list[Path], problems: list[str]) -> list[list[tuple[Path, str]]]:
    """The files to check, a group per argument (a directory's policy files together); a
    directory that cannot be listed or holds none adds to ``problems``."""
    return [_dir_group(f, problems) if f.is_dir() else [(f, str(f))] for f in files]


def _dir_group(directory: Path, problems: list[str]) -> list[tuple[Path, str]]:
    """A directory's policy files, as one group (none when it cannot be listed or holds
    none: that adds to ``problems``)."""
    from sandboxd.policy import PolicyError
    from sandboxd.policy.store import policy_files

    try:
        found = policy_files(directory)
    except PolicyError as exc:
        problems.extend(exc.problems)
        return []
    if not found:
        problems.append(f"{directory}: no policy files (*.yaml, *.yml) in this directory")
    return [(p, str(directory / p.name)) for p in found]


def _check_load(groups: list[list[tuple[Path, str]]], problems: list[str]) -> list[LoadedPolicy]:
    """Each group loaded as one policy set, as the daemon would; what fails adds to
    ``problems``."""
    from sandboxd.policy import PolicyError, load_set

    loaded: list[LoadedPolicy] = []
    for group in groups:  # (an empty group loads as an empty set)
        try:
            loaded.extend(load_set(group).policies)
        except PolicyError as exc:
            problems.extend(exc.problems)
    return loaded


def _fmt_limits(limits: Limits) -> str:
    """Every limit of the one table (protocol.limits), by its policy key, then the network."""
    from sandboxd.policy.units import format_limit
    from sandboxd.protocol.limits import LIMITS

    shown = [f"{info.policy} {format_limit(name, getattr(limits, name))}"
             for name, info in LIMITS.items()]
    return ", ".join([*shown, f"network {'yes' if limits.network else 'no'}"])


@app.command("explain")
def explain(
    tool: str = typer.Option(..., "--tool", help="Tool name, e.g. shell"),
    args: str = typer.Option("{}", "--args", help="Arguments as a JSON object"),
    client: str = typer.Option("local", "--client", help="Client name (token owner)"),
    policies: Path | None = typer.Option(
        None, "--policies", help="Policies directory (default: settings, else embedded)"),
    limits: str | None = typer.Option(None, "--limits", help='Requested limits, JSON, e.g. '
                                      '\'{"timeout_s": 5}\''),
    as_json: bool = typer.Option(False, "--json", help="Print the decision as JSON"),
    config: Path | None = CONFIG_OPTION,
) -> None:
    """Show the decision and the rule that makes it, without running anything.

    Exit 0 when the call would be allowed, 1 when denied, 2 for bad input."""
    from sandboxd.tools import ArgumentsInvalid

    arguments, requested = _explain_input(args, limits)
    service = loaded_offline_service(policies_or_settings(policies, config), 2)
    try:  # the daemon's own explain: the same tool lookup, schema check and decision
        explanation = service.explain(client, tool, arguments, requested,
                                      unknown_tool_denied=True)
    except ArgumentsInvalid as exc:
        typer.echo(f"sandboxd: invalid arguments: {exc}", err=True)
        raise typer.Exit(2) from None
    decision, where = explanation.decision, explanation.location
    lowered = _lowered(decision, requested)
    if as_json:
        _explain_json(decision, where, lowered)
    else:
        _explain_text(tool, client, decision, where, lowered)
    if not decision.allowed:
        raise typer.Exit(1)


def _lowered(decision: Decision,
             requested: LimitsRequest | None) -> dict[str, tuple[float, float]]:
    """The limits asked for that the policy lowers: name -> (asked, granted)."""
    asked = requested.asked() if requested is not None else None
    return decision.limits.lowered_requests(asked) if decision.limits is not None else {}


def _explain_input(args: str, limits: str | None) -> tuple[dict[str, Any], LimitsRequest | None]:
    """``--args`` and ``--limits`` decoded (exit 2, one line, when they are not)."""
    from pydantic import ValidationError

    from sandboxd.models import LimitsRequest

    try:
        arguments = json.loads(args)
    except json.JSONDecodeError as exc:
        typer.echo(f"sandboxd: --args is not valid JSON: {exc}", err=True)
        raise typer.Exit(2) from None
    if not isinstance(arguments, dict):
        typer.echo("sandboxd: --args must be a JSON object", err=True)
        raise typer.Exit(2)
    requested = None
    if limits:
        try:
            requested = LimitsRequest.model_validate_json(limits)
        except ValidationError as exc:
            typer.echo(f"sandboxd: --limits: {exc.errors()[0]['msg']}", err=True)
            raise typer.Exit(2) from None
    return arguments, requested


def _explain_json(decision: Decision, where: str | None,
                  lowered: dict[str, tuple[float, float]]) -> None:
    """The decision as ``--json`` prints it."""
    out = decision.model_dump(mode="json")
    out["location"] = where
    if decision.plan is not None and decision.plan.egress is not None:
        out["egress"] = decision.plan.egress.describe()
    out["lowered"] = {name: {"requested": wanted, "granted": granted}
                      for name, (wanted, granted) in lowered.items()}
    typer.echo(json.dumps(out, indent=2))


def _explain_text(tool: str, client: str, decision: Decision, where: str | None,
                  lowered: dict[str, tuple[float, float]]) -> None:
    """The decision as a person reads it, one ``what:`` line each."""
    lines = [("decision", "allow" if decision.allowed else "deny"),
             ("tool", f"{tool}    client: {client}    policy: {decision.policy_name or '-'}"),
             ("rule", f"{where}: {decision.rule}"),
             *_explain_details(decision)]
    from sandboxd.policy.units import format_limit

    lines += [("lowered", f"{name} requested {format_limit(name, wanted)}, granted "
                          f"{format_limit(name, granted)} (the policy's limit)")
              for name, (wanted, granted) in lowered.items()]
    for what, text in lines:
        typer.echo(f"{what + ':':<10}{text}")


def _explain_details(decision: Decision) -> Iterator[tuple[str, str]]:
    """The decision's optional lines, in order: its message, the approval it waits for, the
    backend, what it runs, its limits, and what its sandbox may reach (a line each)."""
    if decision.message:
        yield "message", decision.message
    if decision.approve is not None:
        gate = decision.approve
        yield "approval", (f"needed ({gate.rule}): waits up to {gate.timeout_s:g} s for "
                           f"{_approvers(gate.by, gate.elicit)}")
    if decision.backend:
        yield "backend", decision.backend
    plan = decision.plan
    if plan is not None:
        yield from _plan_lines(plan, decision.allowed)
    if decision.limits is not None:
        yield "limits", _fmt_limits(decision.limits)
    yield from _egress_lines(decision)


def _egress_lines(decision: Decision) -> Iterator[tuple[str, str]]:
    """What the sandbox of an allowed call may reach, a line each (nothing for a denial)."""
    plan = decision.plan
    if decision.allowed and plan is not None and plan.egress is not None:
        yield from (("egress", line) for line in plan.egress.describe())


def _approvers(by: list[str], elicit: bool) -> str:
    """Who may approve the call: the named approvers, or (``elicit``) the MCP host's user."""
    people = [", ".join(by)] if by else []
    return " or ".join([*people, *(["the calling MCP host's user"] if elicit else [])])


def _plan_lines(plan: Any, allowed: bool) -> Iterator[tuple[str, str]]:
    """What the call would run: its argv or its command plan, the modules it may import."""
    if plan.argv is not None:
        yield "argv", json.dumps(plan.argv)
    elif plan.command is not None:
        yield "runs", f"{plan.command.render()}  (no shell)"
    if allowed and plan.imports_allow:
        yield "imports", ", ".join(plan.imports_allow)


@app.command("show")
def show(
    client: str | None = typer.Option(None, "--client", help="Only the policy of this client"),
    policies: Path | None = typer.Option(
        None, "--policies", help="Policies directory (default: settings, else embedded)"),
    config: Path | None = CONFIG_OPTION,
) -> None:
    """Show the policies in force: who gets which, which tools, on which backend, limits."""
    from sandboxd.policy.specs import tool_specs

    store = loaded_policy_store(policies_or_settings(policies, config), 2)
    chosen = store.policies()
    if client is not None:
        pol = store.policy_for(client)
        if pol is None:
            typer.echo(f"client '{client}': no policy applies (every call is denied)")
            return
        chosen = [pol]
    for pol in chosen:
        typer.echo(f"{pol.source}: policy '{pol.name}'; clients: {', '.join(pol.spec.clients)}")
        for spec in tool_specs(pol):
            typer.echo(_tool_line(pol, spec))


def _tool_line(pol: LoadedPolicy, spec: ToolSpec) -> str:
    """One tool of a policy as ``policy show`` lists it: its backend, and the limits its
    settings give it (under the tool's network, else the policy's)."""
    from sandboxd.policy.engine import effective_limits
    from sandboxd.policy.specs import tool_network

    cfg = getattr(pol.spec.tools, spec.name, None) or pol.spec.custom_tools.get(spec.name)
    line = f"  {spec.name:<14} backend {spec.backend}"
    if cfg is None or cfg.limits is None:
        return line
    net = tool_network(pol, cfg)
    limits = effective_limits(pol.spec, cfg.limits, None, None if net == "none" else net)
    return f"{line}; {_fmt_limits(limits)}"


_register_replay(app)  # `policy replay` and `policy suggest`: their own module
