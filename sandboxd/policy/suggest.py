"""A least-privilege policy for one client, from what its audit log shows it did
(``sandboxd policy suggest``): only the tools, imports, programs and paths of its allowed
calls, with the largest limits those calls got, and comments on what was seen how often.

The facts come from the arguments a decision record holds in full
(:func:`sandboxd.policy.replay.recorded_arguments`); a call whose arguments were cut or redacted
is counted in a comment and admits nothing (its imports or paths are not known).
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode

from sandboxd.policy.engine import imported_modules
from sandboxd.policy.loader import LoadedPolicy
from sandboxd.policy.paths import PathRefused, normalise
from sandboxd.policy.replay import recorded_arguments
from sandboxd.policy.shell import ShellRefused, parse, program_name, wrapped_index
from sandboxd.policy.units import format_duration, format_size
from sandboxd.protocol.limits import LIMITS

FILE_TOOLS = ("read_file", "write_file", "list_files")
#: the tools a suggestion writes from the log (admin-defined ones are copied from the policy
#: in force: a log does not hold their definition)
SUGGESTED = ("python", "shell", *FILE_TOOLS)


@dataclass
class _Seen:
    """What one tool's allowed calls used."""

    calls: int = 0
    backend: str | None = None
    network: str | None = None
    limits: dict[str, float] = field(default_factory=dict)
    names: Counter[str] = field(default_factory=Counter)  # imports, programs or paths
    operators: bool = False


def _quoted(text: str) -> str:
    """``text`` as a YAML double-quoted scalar (JSON's form; characters beyond ASCII as they
    are: YAML would read a ``\\u`` surrogate pair as two characters)."""
    return json.dumps(text, ensure_ascii=False)


def _glob_literal(path: str) -> str:
    """A glob that matches exactly ``path`` (glob characters in brackets)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)


def _programs(line: str) -> tuple[list[str], bool]:
    """The programs a shell line runs (wrapped ones too) and whether it needs operators."""
    try:
        pipes, operators = parse(line, operators=False), False
    except ShellRefused:
        pipes, operators = parse(line, operators=True), True
    names: list[str] = []
    for pipe in pipes:
        for cmd in pipe.commands:
            operators = operators or bool(cmd.redirects)
            at = 0
            while at < len(cmd.argv):
                name = program_name(cmd.argv[at]) or cmd.argv[at]
                names.append(name)
                inner = wrapped_index(name, cmd.argv[at:])
                if inner is None:
                    break
                at += inner
    return names, operators


def _note(seen: _Seen, tool: str, args: dict[str, Any]) -> None:
    if tool == "python":
        seen.names.update(list(dict.fromkeys(
            m for m, _ in imported_modules(str(args.get("code", ""))))))
    elif tool == "shell":
        names, operators = _programs(str(args.get("command", "")))
        seen.names.update(list(dict.fromkeys(names)))
        seen.operators = seen.operators or operators
    else:
        with contextlib.suppress(PathRefused):  # (an allowed call's path is not refused)
            seen.names[normalise(str(args.get("path", ".")))] += 1


def _limits_block(limits: dict[str, float], indent: str) -> list[str]:
    out = [f"{indent}limits:"]
    for name, info in LIMITS.items():
        if name not in limits:
            continue
        value = limits[name]
        text = (format_duration(value) if info.unit == "seconds"
                else format_size(int(value)) if info.unit == "bytes" else f"{value:g}")
        out.append(f"{indent}  {info.policy}: {text}")
    return out


def custom_definition(pol: LoadedPolicy | None, name: str) -> str | None:
    """The YAML of the admin-defined tool ``name`` as ``pol``'s file writes it (its own
    nodes, re-emitted: not re-derived from the validated model), or None."""
    if pol is None or name not in pol.spec.custom_tools:
        return None
    tools = next((v for k, v in pol.root.value if getattr(k, "value", None) == "custom_tools"),
                 None)
    if not isinstance(tools, MappingNode):
        return None
    for pair in tools.value:
        if getattr(pair[0], "value", None) == name:
            return yaml.serialize(MappingNode("tag:yaml.org,2002:map", [pair]))
    return None


@dataclass
class _Usage:
    """What one client's audited calls show: the tools it used and the calls nothing is
    written for (denied, arguments not recorded in full, tools this command cannot write)."""

    tools: dict[str, _Seen] = field(default_factory=lambda: defaultdict(_Seen))
    denied: Counter[str] = field(default_factory=Counter)
    unknown: Counter[str] = field(default_factory=Counter)
    other: Counter[str] = field(default_factory=Counter)

    def add(self, record: dict[str, Any]) -> None:
        tool = str(record.get("tool"))
        if record.get("decision") != "allow":
            self.denied[tool] += 1
            return
        if tool not in SUGGESTED:
            self.other[tool] += 1
            return
        args = recorded_arguments(record)
        if isinstance(args, str):
            self.unknown[tool] += 1
            return
        seen = self.tools[tool]
        seen.calls += 1
        seen.backend = record.get("backend") or seen.backend
        seen.network = record.get("network") or seen.network
        for name, value in (record.get("limits") or {}).items():
            if name in LIMITS and isinstance(value, int | float):
                seen.limits[name] = max(seen.limits.get(name, value), value)
        _note(seen, tool, args)


def _header(usage: _Usage, client: str, audit: str, copied: dict[str, str]) -> list[str]:
    """The file's opening comments: where it comes from, and every call it adds nothing for."""
    lines = [
        f"# Least-privilege policy for client {client!r}, written by `sandboxd policy suggest`",
        f"# from the audit log {audit}: only what its allowed calls used.",
        "# Review it before use: a call that the log does not show is denied.",
    ]
    for tool, n in sorted(usage.denied.items()):
        lines.append(f"# {tool}: {n} denied call(s) seen; nothing added for them")
    for tool, n in sorted(usage.unknown.items()):
        lines.append(f"# {tool}: {n} allowed call(s) with arguments not recorded in full "
                     "(cut or redacted): what they used is not known, nothing added for them")
    for tool, n in sorted(usage.other.items()):
        if tool not in copied:
            lines.append(f"# {tool}: {n} allowed call(s) of a tool this command cannot write "
                         "(copy its definition from the policy in force)")
    return lines


#: the rule list a built-in tool's block writes (the file tools: ``paths``)
_RULES = {"python": "imports", "shell": "commands"}


def _tool_block(tool: str, seen: _Seen, *, own_limits: bool) -> list[str]:
    """One tool's entry under ``tools:``: its backend and network, the rules its calls needed
    (imports, programs or paths, each with how many calls used it), its limits if its own."""
    lines = [f"  {tool}:  # {seen.calls} allowed call(s)"]
    if tool in ("python", "shell") and seen.backend:
        lines.append(f"    backend: {seen.backend}")
    if seen.network:
        lines.append(f"    network: {_quoted(seen.network)}")
    entries = sorted(seen.names.items(), key=lambda kv: (-kv[1], kv[0]))
    key = _RULES.get(tool, "paths")
    lines += [f"    {key}:", "      allow:" + ("" if entries else " []")]
    if tool in _RULES:
        lines += [f"        - {_quoted(name)}  # in {n} call(s)" for name, n in entries]
    else:
        lines += [f"        - {_quoted(_glob_literal(p))}  # {n} call(s)" for p, n in entries]
    if tool == "shell":
        lines.append(f"    operators: {'true' if seen.operators else 'false'}")
    elif tool not in _RULES:
        lines.append("    # max_bytes: the default (1Mi); the log does not record file sizes")
    if seen.limits and own_limits:
        lines.append("    # the largest limits these calls got")
        lines += _limits_block(seen.limits, "    ")
    return lines


def suggest(records: Iterable[dict[str, Any]], client: str, *, audit: str,
            definitions: dict[str, str] | None = None) -> str:
    """The text of a policy file for ``client`` from its ``decision`` records;
    ``definitions``: the YAML of admin-defined tools (:func:`custom_definition`) to copy
    for the ones it used."""
    definitions = definitions or {}
    usage = _Usage()
    for record in records:
        if record.get("client") == client:
            usage.add(record)
    copied = {t: definitions[t] for t in sorted(usage.other) if t in definitions}
    lines = _header(usage, client, audit, copied)
    lines += ["version: 1", f"name: {_quoted(f'{client}-suggested')}",
              f"clients: [{_quoted(client)}]", "network: none"]
    # limits every tool got alike are said once, for the policy; others per tool
    shared = [seen.limits for seen in usage.tools.values()]
    common = shared[0] if shared and all(x == shared[0] for x in shared) else {}
    if common:
        lines.append("# the largest limits the calls got")
        lines += _limits_block(common, "")
    lines.append("tools:" if usage.tools else "tools: {}")
    for tool in (t for t in SUGGESTED if t in usage.tools):
        lines += _tool_block(tool, usage.tools[tool], own_limits=not common)
    if copied:
        lines.append("custom_tools:")
        for tool, text in copied.items():
            lines.append(f"  # {usage.other[tool]} allowed call(s); the definition in force, "
                         "copied")
            lines += [f"  {line}" for line in text.rstrip("\n").splitlines()]
    return "\n".join(lines) + "\n"
