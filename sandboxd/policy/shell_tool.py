"""The policy's decision for a ``shell`` call: the line parsed (:mod:`sandboxd.policy.shell`),
every program of every command checked against ``commands`` (wrapped programs too), each known
program hardened (:mod:`sandboxd.policy.programs`), redirects confined to the workspace, and
the plan the backend's runner executes without a shell."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sandboxd.models import Decision
from sandboxd.policy.models import ShellTool
from sandboxd.policy.paths import PathRefused, normalise
from sandboxd.policy.programs import EXTENDING_WRAPPERS, HARDENED
from sandboxd.policy.shell import (
    REDIRECTS,
    SHELL_ONLY,
    Command,
    ShellRefused,
    deny_rule,
    is_assignment,
    parse,
    program_name,
    wrapped_index,
)
from sandboxd.policy.shell import (
    Pipeline as ParsedPipeline,
)
from sandboxd.policy.shell import Redirect as ParsedRedirect
from sandboxd.policy.specs import listing
from sandboxd.protocol.environment import check_env
from sandboxd.protocol.plan import Pipeline, Plan, PlannedCommand, Redirect
from sandboxd.util.text import visible

if TYPE_CHECKING:
    from sandboxd.policy.engine import _Ctx

MAX_WRAPPERS = 3  # programs nested in wrappers (``env nice timeout x``)
_ALLOW_RULE = "tools.shell.commands.allow"
_OPERATOR_HELP = ("run a single program per call, without pipes, `;`, `&&`, `||`, `&`, "
                  "redirects, `$(...)` or backticks")
_OPERATORS_NOTE = ("This tool runs programs joined by pipes, `;`, `&&`, `||` and redirects, "
                   "without a shell.")


def _sentence(text: str) -> str:
    return f"{text[0].upper()}{text[1:]}."


def _program_refusal(cfg: ShellTool, word: str, allowed_text: str) -> tuple[str, str] | None:
    """Why the program word ``word`` may not run (rule, message), or None when it is allowed."""
    if is_assignment(word):
        return _ALLOW_RULE, (f"Variable assignments such as `{word}` are not allowed here; "
                             f"{allowed_text}.")
    name = program_name(word)
    if name is None:
        return _ALLOW_RULE, (f"Run programs by name (such as `ls`), not by path: `{word}` is "
                             f"not allowed here; {allowed_text}.")
    if name in SHELL_ONLY:
        return _ALLOW_RULE, (f"`{name}` is a shell builtin, and this tool runs programs without "
                             "a shell; the current directory is the workspace (use paths "
                             f"relative to it). {_sentence(allowed_text)}")
    denied = deny_rule(cfg.commands.deny, name)
    if denied is not None:
        return denied, f"`{name}` is not allowed here; {allowed_text}."
    if name not in cfg.commands.allow:
        return _ALLOW_RULE, f"`{name}` is not allowed here; {allowed_text}."
    return None


def _allowed_text(cfg: ShellTool) -> str:
    """What a refused program's message lists instead: the programs the policy allows."""
    allowed = [c for c in cfg.commands.allow if c not in cfg.commands.deny]
    return f"allowed commands: {listing(allowed)}"


def _check_program(ctx: _Ctx, cfg: ShellTool, argv: list[str]) -> tuple[str, list[int]] | Decision:
    """The allow rule admitting ``argv[0]`` and every program it wraps, with the positions of
    those programs in ``argv``; or a denial."""
    allowed_text = _allowed_text(cfg)
    positions: list[int] = []
    rule = ""
    at = 0
    while True:
        refusal = _program_refusal(cfg, argv[at], allowed_text)
        if refusal is not None:
            return ctx.deny(*refusal)
        name = program_name(argv[at]) or ""
        if not positions:
            rule = f"tools.shell.commands.allow[{cfg.commands.allow.index(name)}]"
        positions.append(at)
        inner = wrapped_index(name, argv[at:])
        if inner is None:
            return rule, positions
        if len(positions) > MAX_WRAPPERS:
            return ctx.deny(_ALLOW_RULE, "Too many nested wrapper programs.")
        at += inner


def harden(argv: list[str], positions: list[int]) -> PlannedCommand | str:
    """The command that runs ``argv`` (whose programs stand at ``positions``) with the
    hardening of every known program in it (:mod:`sandboxd.policy.programs`), or why not."""
    names = [program_name(argv[p]) or argv[p] for p in positions]
    hardened = [k for k, name in enumerate(names) if name in HARDENED]
    if not hardened:
        return PlannedCommand(argv=tuple(argv))
    out = list(argv)
    env: dict[str, str] = {}
    exec_only: list[str] = []
    for k in reversed(hardened):
        refusal = _hardening_refusal(argv, positions, names, k)
        if refusal is not None:
            return refusal
        pos, rules = positions[k], HARDENED[names[k]]
        out[pos + 1:pos + 1] = rules.options(argv[pos + 1:])
        env.update(rules.env)
        exec_only += [*names[:k], *rules.exec_only]
    return PlannedCommand(argv=tuple(out), env=env, exec_only=tuple(dict.fromkeys(exec_only)))


def _hardening_refusal(argv: list[str], positions: list[int], names: list[str],
                       k: int) -> str | None:
    """Why the hardened program ``names[k]`` may not run as ``argv`` calls it (inside the
    wrappers ``names[:k]``): its own check, or an ``env`` wrapper given arguments."""
    outer, pos = names[:k], positions[k]
    # `env NAME=value git` or `env -u GIT_... git` would undo the hardening's environment
    if any(n == "env" and positions[j + 1] - positions[j] > 1 for j, n in enumerate(outer)):
        return f"`env` may not change the environment of `{names[k]}` here"
    return HARDENED[names[k]].check(argv[pos + 1:],
                                    any(w in EXTENDING_WRAPPERS for w in outer))


def _redirect(ctx: _Ctx, r: ParsedRedirect) -> Redirect | Decision:
    """A parsed redirect as the runner performs it; targets are workspace paths."""
    mode = REDIRECTS[r.op]
    if mode == "dup":
        return _descriptor_redirect(r)
    if r.target == "/dev/null":
        return Redirect(fd=r.fd, mode=mode, path="/dev/null")
    try:
        path = normalise(r.target)
    except PathRefused as exc:
        return ctx.deny("tools.shell.operators",
                        f"The redirect target `{visible(r.target)}` is not allowed: {exc}. "
                        "Redirects may name files in the workspace, or /dev/null.")
    if path == ".":
        return ctx.deny("tools.shell.operators",
                        f"The redirect target `{visible(r.target)}` is the workspace itself; "
                        "name a file.")
    return Redirect(fd=r.fd, mode=mode, path=path)


def _descriptor_redirect(r: ParsedRedirect) -> Redirect:
    """``n>&m`` / ``n<&m`` (the parser admits a descriptor 0-9 or ``-``): ``-`` closes ``n``,
    a descriptor duplicates onto it."""
    if r.target == "-":
        return Redirect(fd=r.fd, mode="close")
    return Redirect(fd=r.fd, mode="dup", dup=int(r.target))


def screen(ctx: _Ctx, deny_patterns: Sequence[str], text: str, rule: str,
           what: str) -> Decision | None:
    """The denial of a shell tool's ``text`` (``what`` names it: a command line, code) that
    holds a NUL or matches one of the policy's ``deny_patterns``; None when neither. The shell
    and bash tools both screen with this, before their text is parsed."""
    if "\x00" in text:
        return ctx.deny(rule, f"The {what} must not contain NUL characters.")
    for i, pattern in enumerate(deny_patterns):
        if re.search(pattern, text):
            return ctx.deny(f"tools.shell.deny_patterns[{i}]",
                            f"This {what} is not allowed here (it matches a pattern the "
                            "policy forbids).")
    return None


def _parsed_line(ctx: _Ctx, cfg: ShellTool, line: str) -> list[ParsedPipeline] | Decision:
    """The pipelines of ``line`` (a NUL, a ``deny_patterns`` match, a refused construct or
    an empty line: a denial)."""
    refused = screen(ctx, cfg.deny_patterns, line, "tools.shell", "command line")
    if refused is not None:
        return refused
    try:
        parsed = parse(line, operators=cfg.operators)
    except ShellRefused as exc:
        return ctx.deny(*_parse_refusal(cfg, exc))
    if not parsed:
        return ctx.deny("tools.shell", "The command line is empty.")
    return parsed


def _parse_refusal(cfg: ShellTool, exc: ShellRefused) -> tuple[str, str]:
    """The rule and the message of a construct the parser refused: an unterminated quote, or
    what the tool's dialect (with or without ``operators``) does not run."""
    if exc.construct in ("'", '"'):
        return "tools.shell", f"{exc}."
    if not cfg.operators:
        return "tools.shell.operators", f"{exc}; {_OPERATOR_HELP}."
    return "tools.shell.operators", f"{exc}. {_OPERATORS_NOTE}"


def _planned(ctx: _Ctx, cfg: ShellTool, cmd: Command,
             env: dict[str, str]) -> tuple[str, PlannedCommand] | Decision:
    """One parsed command checked and planned: the rule that allows it and what runs."""
    verdict = _check_program(ctx, cfg, cmd.argv)
    if isinstance(verdict, Decision):
        return verdict
    rule, positions = verdict
    planned = harden(cmd.argv, positions)
    if isinstance(planned, str):
        return ctx.deny(rule, _sentence(planned))
    if env and planned.env:  # as `env NAME=value git`: the hardening's environment
        return ctx.deny(rule, f"The environment of `{cmd.argv[positions[-1]]}` may "
                        "not be changed here.")
    redirects = _redirects(ctx, cmd.redirects)
    if isinstance(redirects, Decision):
        return redirects
    return rule, replace(planned, env=dict(env) or planned.env, redirects=redirects)


def _redirects(ctx: _Ctx, parsed: Sequence[ParsedRedirect]) -> tuple[Redirect, ...] | Decision:
    """A command's redirects as the runner performs them, or the first refused one's
    denial."""
    redirects: list[Redirect] = []
    for r in parsed:
        planned = _redirect(ctx, r)
        if isinstance(planned, Decision):
            return planned
        redirects.append(planned)
    return tuple(redirects)


def decide_shell(ctx: _Ctx, cfg: ShellTool, network: str | None,
                 arguments: dict[str, Any]) -> Decision:
    """The decision for one ``shell`` call (``network``: the one the tool is granted)."""
    parsed = _parsed_line(ctx, cfg, str(arguments.get("command", "")))
    if isinstance(parsed, Decision):
        return parsed
    try:
        env = check_env(arguments.get("env"))
    except ValueError as exc:
        return ctx.deny("tools.shell", f"{exc}.")
    rules: list[str] = []
    pipelines: list[Pipeline] = []
    for pipe in parsed:
        planned = _planned_pipeline(ctx, cfg, pipe, env)
        if isinstance(planned, Decision):
            return planned
        rules += planned[0]
        pipelines.append(planned[1])
    return ctx.allow(", ".join(dict.fromkeys(rules)), cfg.limits, network,
                     command=Plan(pipelines=tuple(pipelines)), image=cfg.image,
                     egress=ctx.egress(cfg))


def _planned_pipeline(ctx: _Ctx, cfg: ShellTool, pipe: ParsedPipeline,
                      env: dict[str, str]) -> tuple[list[str], Pipeline] | Decision:
    """One parsed pipeline planned: the rule allowing each command and what runs; or the
    denial of its first refused command."""
    rules: list[str] = []
    commands: list[PlannedCommand] = []
    for cmd in pipe.commands:
        verdict = _planned(ctx, cfg, cmd, env)
        if isinstance(verdict, Decision):
            return verdict
        rules.append(verdict[0])
        commands.append(verdict[1])
    return rules, Pipeline(run_if=pipe.run_if, commands=tuple(commands))
