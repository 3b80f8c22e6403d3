"""What the daemon knows of a ``javascript``/``typescript`` call's code before it runs: the
modules it names literally (``require('x')``, ``import ... from 'x'``, ``import('x')``,
``export ... from 'x'``), with their line and column, and the one module rule both the policy
(before the call) and the kernel's ``require`` (while it runs) apply.

The scan reads text, not a parse: a name in a string or a comment that looks like one of
these forms counts too (a refusal, never a module let through). What the code names at run
time (``require(name)``) is checked by the kernel; neither check is the boundary: the
container is (non-root, no network, no exec but node, its limits).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: denied unless a policy names them in ``modules.allow``: what reaches processes, the
#: network, threads that outlive a call, the module loader, the inspector or V8 itself
DEFAULT_DENY = ("child_process", "cluster", "dgram", "dns", "http", "http2", "https",
                "inspector", "module", "net", "process", "repl", "tls", "trace_events",
                "v8", "vm", "wasi", "worker_threads")

_NAME = r"""(?P<q>['"`])(?P<name>[^'"`\n]{1,200})(?P=q)"""
_FORMS = re.compile(
    r"\brequire\s*\(\s*" + _NAME
    + r"|\bimport\s*\(\s*" + _NAME.replace("q>", "q2>").replace("(?P=q)", "(?P=q2)")
      .replace("name>", "name2>")
    + r"|\b(?:import|export)\b[^;'\"`]*?\bfrom\s*" + _NAME.replace("q>", "q3>")
      .replace("(?P=q)", "(?P=q3)").replace("name>", "name3>")
    + r"|^\s*import\s*" + _NAME.replace("q>", "q4>").replace("(?P=q)", "(?P=q4)")
      .replace("name>", "name4>"),
    re.MULTILINE)


@dataclass(frozen=True)
class ModuleUse:
    """A module the code names, and where (1-based line and column)."""

    name: str
    line: int
    column: int


def named_modules(code: str) -> list[ModuleUse]:
    """The modules ``code`` names literally, in order."""
    found = []
    for m in _FORMS.finditer(code):
        key = next(k for k in ("name", "name2", "name3", "name4") if m.group(k) is not None)
        at = m.start(key)
        line = code.count("\n", 0, at) + 1
        found.append(ModuleUse(m.group(key), line, at - (code.rfind("\n", 0, at) + 1) + 1))
    return found


def bare(name: str) -> str:
    """``node:fs`` -> ``fs``; a package's path -> its package (``@a/b/c`` -> ``@a/b``)."""
    name = name.removeprefix("node:")
    parts = name.split("/")
    return "/".join(parts[:2]) if name.startswith("@") else parts[0]


def effective_deny(allow: list[str], deny: list[str]) -> list[str]:
    """The policy's ``deny``, then the built-in ones its ``allow`` does not name."""
    return [*deny, *(d for d in DEFAULT_DENY if d not in allow and d not in deny)]


def verdict(name: str, allow: list[str], deny: list[str]) -> tuple[bool, str]:
    """(admitted, the rule that decides) for module ``name``; the rule is ``deny[i]`` (the
    policy's list), ``builtin`` (:data:`DEFAULT_DENY`), ``allow`` or ``relative`` (a file:
    the kernel confines files to the workspace)."""
    plain = name.removeprefix("node:")
    if plain.startswith((".", "/")):
        return True, "relative"
    top = bare(plain)
    denied = _denied_by(deny, plain, top)
    if denied is not None:
        return False, f"deny[{denied}]"
    if top in DEFAULT_DENY and top not in allow:
        return False, "builtin"
    return any(n in allow for n in ("*", top, plain)), "allow"


def _denied_by(deny: list[str], plain: str, top: str) -> int | None:
    """The index of the first ``deny`` entry that names the module ``plain`` or its package
    ``top`` (an entry naming a package denies every path in it)."""
    return next((i for i, rule in enumerate(deny) if bare(rule) == top or rule == plain), None)
