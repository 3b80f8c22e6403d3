"""The policy's decision for a ``bash`` call: its code read into simple commands
(:mod:`sandboxd.languages.bash_scan`), each program it names checked against the shell tool's
``commands`` (one rule for both tools: a program denied there is denied here, with the same
rule), and the plan that confines the session's bash kernel to the allowed programs at run
time (Landlock, in the container): what the code runs through a variable, ``eval`` or a
script is known only then."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sandboxd.languages.bash_scan import simple_commands
from sandboxd.models import Decision
from sandboxd.policy.models import BashTool
from sandboxd.policy.shell import deny_rule, wrapped_index
from sandboxd.policy.shell_tool import screen
from sandboxd.policy.specs import listing

if TYPE_CHECKING:
    from sandboxd.policy.engine import _Ctx

MAX_WRAPPED = 3  # programs nested in wrappers (``env nice timeout x``), as the shell tool


def decide_bash(ctx: _Ctx, cfg: BashTool, network: str | None,
                arguments: dict[str, Any]) -> Decision:
    """The decision for one ``bash`` call (``network``: the one the tool is granted)."""
    shell = ctx.pol.spec.tools.shell
    if shell is None:
        return ctx.deny("tools.bash", "The bash tool runs the programs tools.shell.commands "
                                      "allows, and this policy has no tools.shell block.")
    code = str(arguments.get("code", ""))
    refused = screen(ctx, shell.deny_patterns, code, "tools.bash", "code")
    if refused is not None:
        return refused
    commands = shell.commands
    allowed = [c for c in commands.allow if c not in commands.deny]
    for cmd in simple_commands(code):
        for name in _programs(cmd.words):
            rule = deny_rule(commands.deny, name)
            if rule is not None:
                return ctx.deny(rule, f"`{name}` is not allowed here (line {cmd.line}, "
                                      f"column {cmd.column}); allowed commands: "
                                      f"{listing(allowed)}.")
    return ctx.allow("tools.bash", cfg.limits, network, image=cfg.image,
                     programs=tuple(allowed))


def _programs(words: list[str | None]) -> Iterator[str]:
    """The program a simple command runs, then those its wrappers run (``env nice timeout
    x``, up to :data:`MAX_WRAPPED` deep), until a word known only when it runs (None): the
    kernel's confinement decides that one."""
    plain = [w or "" for w in words]  # what a wrapper sees of a word expanded at run time
    at = 0
    for _ in range(MAX_WRAPPED + 1):
        word = words[at] if at < len(words) else None
        if word is None:
            return
        name = posixpath.basename(word) or word
        yield name
        inner = wrapped_index(name, plain[at:])
        if inner is None:
            return
        at += inner
