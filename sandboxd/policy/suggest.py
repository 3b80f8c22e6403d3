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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node

from sandboxd.policy.engine import imported_modules
from sandboxd.policy.loader import LoadedPolicy
from sandboxd.policy.paths import PathRefused, normalise
from sandboxd.policy.replay import recorded_arguments
from sandboxd.policy.shell import ShellRefused, parse, program_name, wrapped_index
from sandboxd.policy.units import format_limit
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
            names += _wrapping(cmd.argv)
    return names, operators


def _wrapping(argv: list[str]) -> list[str]:
    """The program of one command, then the ones it wraps (``timeout 5 nice ls``: all three)."""
    names: list[str] = []
    at = 0
    while at < len(argv):
        names.append(program_name(argv[at]) or argv[at])
        inner = wrapped_index(names[-1], argv[at:])
        if inner is None:
            break
        at += inner
    return names


def _note_imports(seen: _Seen, args: dict[str, Any]) -> None:
    """A python call: the modules it imports (each once per call)."""
    seen.names.update(list(dict.fromkeys(
        m for m, _ in imported_modules(str(args.get("code", ""))))))


def _note_programs(seen: _Seen, args: dict[str, Any]) -> None:
    """A shell call: the programs it runs (each once per call), whether it needs operators."""
    names, operators = _programs(str(args.get("command", "")))
    seen.names.update(list(dict.fromkeys(names)))
    seen.operators = seen.operators or operators


def _note_path(seen: _Seen, args: dict[str, Any]) -> None:
    """A file tool's call: the path it names."""
    with contextlib.suppress(PathRefused):  # (an allowed call's path is not refused)
        seen.names[normalise(str(args.get("path", ".")))] += 1


@dataclass(frozen=True)
class _Kind:
    """How a suggestion reads the calls of one kind of built-in tool and writes its entry."""

    note: Callable[[_Seen, dict[str, Any]], None]  # what one call used
    rules: str  # the rule list the entry writes: imports, commands or paths
    literal: Callable[[str], str]  # an entry of that list as it is written
    counted: str  # how an entry's comment counts the calls that used it
    backend: bool  # whether the entry names a backend (the file tools have none)
    tail: str  # the entry's last line, if any (``{operators}``: whether calls needed them)


_FILE_KIND = _Kind(_note_path, "paths", _glob_literal, "", False,
                   "    # max_bytes: the default (1Mi); the log does not record file sizes")
_KINDS = {"python": _Kind(_note_imports, "imports", str, "in ", True, ""),
          "shell": _Kind(_note_programs, "commands", str, "in ", True,
                         "    operators: {operators}"),
          **dict.fromkeys(FILE_TOOLS, _FILE_KIND)}


def _limits_block(limits: dict[str, float], indent: str) -> list[str]:
    """A ``limits:`` block of ``limits``, in the limits table's order."""
    return [f"{indent}limits:", *(f"{indent}  {info.policy}: {format_limit(name, limits[name])}"
                                  for name, info in LIMITS.items() if name in limits)]


def _entry(node: Node | None, key: str) -> tuple[Node, Node] | None:
    """The ``(key, value)`` nodes of ``key`` in the YAML mapping ``node``, or None."""
    if not isinstance(node, MappingNode):
        return None
    return next((pair for pair in node.value if getattr(pair[0], "value", None) == key), None)


def custom_definition(pol: LoadedPolicy | None, name: str) -> str | None:
    """The YAML of the admin-defined tool ``name`` as ``pol``'s file writes it (its own
    nodes, re-emitted: not re-derived from the validated model), or None."""
    if pol is None or name not in pol.spec.custom_tools:
        return None
    tools = _entry(pol.root, "custom_tools")
    tool = _entry(tools[1], name) if tools is not None else None
    return None if tool is None else yaml.serialize(MappingNode("tag:yaml.org,2002:map", [tool]))


@dataclass
class _Usage:
    """What one client's audited calls show: the tools it used and the calls nothing is
    written for (denied, arguments not recorded in full, tools this command cannot write)."""

    tools: dict[str, _Seen] = field(default_factory=lambda: defaultdict(_Seen))
    denied: Counter[str] = field(default_factory=Counter)
    unknown: Counter[str] = field(default_factory=Counter)
    other: Counter[str] = field(default_factory=Counter)

    def add(self, record: dict[str, Any]) -> None:
        """Count one decision record: as nothing written for it, or as what a tool used."""
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
        _count_call(self.tools[tool], _KINDS[tool], record, args)


def _count_call(seen: _Seen, kind: _Kind, record: dict[str, Any], args: dict[str, Any]) -> None:
    """One more allowed call in ``seen``: where it ran, its limits (the largest so far) and
    what it used."""
    seen.calls += 1
    seen.backend = record.get("backend") or seen.backend
    seen.network = record.get("network") or seen.network
    _raise_limits(seen.limits, record.get("limits") or {})
    kind.note(seen, args)


def _usage_of(records: Iterable[dict[str, Any]], client: str) -> _Usage:
    """What the calls of ``client`` among ``records`` show."""
    usage = _Usage()
    for record in records:
        if record.get("client") == client:
            usage.add(record)
    return usage


def _raise_limits(largest: dict[str, float], got: dict[str, Any]) -> None:
    """``largest`` raised to the limits a call ``got`` (the known ones, numbers only)."""
    for name, value in got.items():
        if name in LIMITS and isinstance(value, int | float):
            largest[name] = max(largest.get(name, value), value)


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


def _allow_block(kind: _Kind, seen: _Seen) -> list[str]:
    """The rule list the calls needed: imports, programs or paths, the most used first, each
    with how many calls used it."""
    entries = sorted(seen.names.items(), key=lambda kv: (-kv[1], kv[0]))
    return [f"    {kind.rules}:", "      allow:" + ("" if entries else " []"),
            *(f"        - {_quoted(kind.literal(name))}  # {kind.counted}{n} call(s)"
              for name, n in entries)]


def _tool_block(tool: str, seen: _Seen, *, own_limits: bool) -> list[str]:
    """One tool's entry under ``tools:``: its backend and network, the rules its calls needed
    (:func:`_allow_block`), its limits if its own."""
    kind = _KINDS[tool]
    lines = [f"  {tool}:  # {seen.calls} allowed call(s)"]
    if kind.backend and seen.backend:
        lines.append(f"    backend: {seen.backend}")
    if seen.network:
        lines.append(f"    network: {_quoted(seen.network)}")
    lines += _allow_block(kind, seen)
    if kind.tail:
        lines.append(kind.tail.format(operators=str(seen.operators).lower()))
    if seen.limits and own_limits:
        lines.append("    # the largest limits these calls got")
        lines += _limits_block(seen.limits, "    ")
    return lines


def _tools_block(usage: _Usage, *, own_limits: bool) -> list[str]:
    """The ``tools:`` entry: a :func:`_tool_block` per built-in tool the client used."""
    return ["tools:" if usage.tools else "tools: {}",
            *(line for tool in SUGGESTED if tool in usage.tools
              for line in _tool_block(tool, usage.tools[tool], own_limits=own_limits))]


def _shared_limits(usage: _Usage) -> dict[str, float]:
    """The limits every tool's calls got alike (said once, for the policy), else none."""
    got = [seen.limits for seen in usage.tools.values()]
    return got[0] if got and all(limits == got[0] for limits in got) else {}


def _custom_block(usage: _Usage, copied: dict[str, str]) -> list[str]:
    """The ``custom_tools:`` entry: the definitions in force of the admin-defined tools the
    client used (none: no entry)."""
    lines = ["custom_tools:"] if copied else []
    for tool, text in copied.items():
        lines.append(f"  # {usage.other[tool]} allowed call(s); the definition in force, copied")
        lines += [f"  {line}" for line in text.rstrip("\n").splitlines()]
    return lines


def suggest(records: Iterable[dict[str, Any]], client: str, *, audit: str,
            definitions: dict[str, str] | None = None) -> str:
    """The text of a policy file for ``client`` from its ``decision`` records;
    ``definitions``: the YAML of admin-defined tools (:func:`custom_definition`) to copy
    for the ones it used."""
    definitions = definitions or {}
    usage = _usage_of(records, client)
    copied = {t: definitions[t] for t in sorted(usage.other) if t in definitions}
    lines = _header(usage, client, audit, copied)
    lines += ["version: 1", f"name: {_quoted(f'{client}-suggested')}",
              f"clients: [{_quoted(client)}]", "network: none"]
    common = _shared_limits(usage)
    if common:
        lines.append("# the largest limits the calls got")
        lines += _limits_block(common, "")
    lines += _tools_block(usage, own_limits=not common)
    return "\n".join(lines + _custom_block(usage, copied)) + "\n"
