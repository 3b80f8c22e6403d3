"""The policy checks that pydantic field validation cannot see: those that need more than one
field (a limit above the maximum of its block, a placeholder that names no parameter), the
backends' registry (a module the backend cannot import, a network it cannot grant) or the
other tools (bash runs what the shell allows). Each problem comes with the location to blame,
which the loader turns into a line and column of the file."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from jsonschema.exceptions import SchemaError

from sandboxd.backends import registry
from sandboxd.policy.egress_checks import (
    block_problems,
    egress_problems,
    lacks_network,
    networked_backends,
)
from sandboxd.policy.models import (
    BUILTIN_NAMES,
    PACKAGE_SPEC,
    PACKAGES_TOOL,
    TOOL_GROUPS,
    ApprovalSpec,
    BashTool,
    CustomTool,
    LimitsSpec,
    Loc,
    PolicyFile,
    PythonTool,
    normalise_package,
    placeholders,
    placeholders_in,
)
from sandboxd.protocol.limits import LIMITS
from sandboxd.tools import check_schema

#: a custom tool's name
_TOOL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")


def _limit_problems(limits: LimitsSpec, loc: Loc) -> Iterator[tuple[Loc, str]]:
    for info in LIMITS.values():
        value_name, max_name = info.policy, info.policy_max
        value, maximum = getattr(limits, value_name), getattr(limits, max_name)
        if value is not None and maximum is not None and value > maximum:
            yield (*loc, value_name), f"{value_name} is above {max_name} of the same block"


def fixed_modules(backend: str) -> frozenset[str] | None:
    """The top-level modules ``backend`` offers when its python has a fixed set (None: it
    imports whatever its image has, or is not registered)."""
    entry = registry.get(backend)
    return entry.offered_modules() if entry is not None else None


def open_python_backends() -> str:
    """The python backends that import any module, as ``a or b``: where packages can be
    installed and any module imported."""
    return " or ".join(e.name for e in registry.entries()
                       if "python" in e.serves and e.imports is None)


def _unimportable(backend: str, allow: list[str], loc: Loc) -> Iterator[tuple[Loc, str]]:
    """Entries of a python tool's ``imports.allow`` that name no module its backend offers
    (they would fail at run time: "allowed by the policy but not available"), each blamed at
    its own position. Backends whose registry entry lists no modules offer any."""
    offered = fixed_modules(backend)
    if offered is None:
        return
    for i, module in enumerate(allow):
        if module != "*" and module.split(".")[0] not in offered:
            yield (*loc, i), (
                f"'{module}' cannot be imported by the {backend} backend (it offers: "
                f"{', '.join(sorted(offered))}); use backend: {open_python_backends()} for it")


def _duplicate_packages(allow: list[str], loc: Loc) -> Iterator[tuple[Loc, str]]:
    """Two entries of ``packages.allow`` naming one package (after normalisation)."""
    seen: dict[str, int] = {}
    for i, entry in enumerate(allow):
        match = PACKAGE_SPEC.match(entry)
        if match is None:
            continue
        name = normalise_package(match["name"])
        if name in seen:
            yield (*loc, i), (f"'{entry}' names the package of entry {seen[name]} again "
                              "(names are compared after PEP 503 normalisation)")
        seen.setdefault(name, i)


def _network_problem(name: str, tool: Any, group: registry.ToolGroup,
                     policy: PolicyFile, loc: Loc) -> Iterator[tuple[Loc, str]]:
    """A tool granted a network (its own or the policy's) on a backend that has none."""
    if "network" not in type(tool).model_fields:
        return
    network = tool.network or policy.network
    if network == "none" or not lacks_network(tool.backend):
        return
    yield (*loc, "network") if tool.network else ("network",), (
        f"the {tool.backend} backend has no network; '{name}' needs backend: "
        f"{networked_backends(group)} to be granted network {network!r}")


def _approval_problems(spec: ApprovalSpec | None, loc: Loc,
                       shell: bool) -> Iterator[tuple[Loc, str]]:
    """An ``approve:`` nobody could answer, or with command patterns outside the shell."""
    if spec is None:
        return
    if not spec.by and not spec.elicit:
        yield (*loc, "by"), ("nobody may approve: list approver clients in 'by', or set "
                             "'elicit: true' to let the calling MCP host's user answer")
    if spec.patterns and not shell:
        yield (*loc, "patterns"), "'patterns' is only meaningful under tools.shell.approve"


def semantic_problems(policy: PolicyFile) -> Iterator[tuple[Loc, str]]:
    """Problems that pydantic field validation cannot see, each with the location to blame."""
    if "*" in policy.clients and len(policy.clients) > 1:
        yield ("clients",), "'*' must be the only entry when present"
    yield from _approvals(policy)
    yield from _limit_problems(policy.limits, ("limits",))
    yield from block_problems(policy.egress, ("egress",))
    for name in BUILTIN_NAMES:
        yield from _builtin_problems(name, policy)
    for tname, tool in policy.custom_tools.items():
        yield from _custom_problems(tname, tool, policy)


def _configured_tools(policy: PolicyFile) -> Iterator[tuple[str, Loc, Any]]:
    """(name, loc, block) of every tool the policy configures: the built-in ones it does not
    leave out, then the custom ones."""
    for name in BUILTIN_NAMES:
        tool = getattr(policy.tools, name)
        if tool is not None:
            yield name, ("tools", name), tool
    for name, tool in policy.custom_tools.items():
        yield name, ("custom_tools", name), tool


def _approvals(policy: PolicyFile) -> Iterator[tuple[Loc, str]]:
    """The ``approve:`` blocks of every tool (and of a python tool's packages)."""
    for tname, where, tool in _configured_tools(policy):
        yield from _approval_problems(tool.approve, (*where, "approve"), tname == "shell")
        if isinstance(tool, PythonTool):
            yield from _approval_problems(tool.packages.approve,
                                          (*where, "packages", "approve"), False)


def _common_problems(name: str, tool: Any, group: registry.ToolGroup, policy: PolicyFile,
                     loc: Loc) -> Iterator[tuple[Loc, str]]:
    """The checks every tool's block gets, built-in or custom: its limits, its network and
    its egress."""
    yield from _limit_problems(tool.limits, (*loc, "limits"))
    yield from _network_problem(name, tool, group, policy, loc)
    yield from egress_problems(name, tool, group, policy, loc)
    yield from block_problems(getattr(tool, "egress", None), (*loc, "egress"))


def _bash_problems(tool: BashTool, policy: PolicyFile, loc: Loc) -> Iterator[tuple[Loc, str]]:
    """The bash tool runs what the shell tool allows: it needs the shell's block."""
    if tool.enabled and policy.tools.shell is None:
        yield loc, ("the bash tool runs what tools.shell.commands allows: add a "
                    "tools.shell block with the commands")


def _python_problems(tool: PythonTool, policy: PolicyFile,
                     loc: Loc) -> Iterator[tuple[Loc, str]]:
    """The python tool's imports (a deny of '*', a module its backend cannot import) and its
    packages (one named twice)."""
    if "*" in tool.imports.deny:
        yield (*loc, "imports", "deny"), "'*' is only meaningful in imports.allow"
    yield from _unimportable(tool.backend, tool.imports.allow, (*loc, "imports", "allow"))
    yield from _duplicate_packages(tool.packages.allow, (*loc, "packages", "allow"))


#: the checks of a built-in tool's own kind, by the class of its block
_KIND_PROBLEMS: dict[type, Callable[[Any, PolicyFile, Loc], Iterator[tuple[Loc, str]]]] = {
    BashTool: _bash_problems, PythonTool: _python_problems}


def _builtin_problems(name: str, policy: PolicyFile) -> Iterator[tuple[Loc, str]]:
    """One built-in tool's block (none when the policy leaves it out)."""
    tool = getattr(policy.tools, name)
    if tool is None:
        return
    loc: Loc = ("tools", name)
    yield from _common_problems(name, tool, TOOL_GROUPS[name], policy, loc)
    kind_problems = _KIND_PROBLEMS.get(type(tool))
    if kind_problems is not None:
        yield from kind_problems(tool, policy, loc)


def _custom_problems(tname: str, tool: CustomTool,
                     policy: PolicyFile) -> Iterator[tuple[Loc, str]]:
    """One custom tool: its name, limits, network, parameters and argv template."""
    loc: Loc = ("custom_tools", tname)
    yield from _name_problems(tname, loc)
    yield from _common_problems(tname, tool, "custom", policy, loc)
    yield from _template_problems(tool, loc)


def _name_problems(tname: str, loc: Loc) -> Iterator[tuple[Loc, str]]:
    """A custom tool's name: well formed, and not one of the built-in tools'."""
    if not _TOOL_NAME.match(tname):
        yield loc, f"{tname!r} is not a valid tool name (letters, digits, '_', '-'; max 64)"
    if tname in (*BUILTIN_NAMES, PACKAGES_TOOL):
        yield loc, f"'{tname}' is a built-in tool; configure it under tools.{tname}"


def _template_problems(tool: CustomTool, loc: Loc) -> Iterator[tuple[Loc, str]]:
    """A custom tool's parameters (a JSON Schema of an object) and the argv template their
    placeholders fill."""
    params = tool.parameters
    try:
        check_schema(params)
    except SchemaError as exc:
        yield (*loc, "parameters"), f"not a valid JSON Schema: {exc.message}"
        return
    if params.get("type") != "object":
        yield (*loc, "parameters"), "parameters must be a JSON Schema with type: object"
        return
    for i, element in enumerate(tool.argv):
        yield from _placeholder_problems(element, params.get("properties") or {},
                                         (*loc, "argv", i))
    if placeholders_in(tool.argv[0]):
        yield (*loc, "argv", 0), "the program (argv[0]) must be fixed, not a placeholder"


def _placeholder_problems(element: str, props: dict[str, Any],
                          loc: Loc) -> Iterator[tuple[Loc, str]]:
    """An argv element's placeholders: plain names of scalar parameters."""
    try:
        names = placeholders(element)
    except ValueError as exc:
        yield loc, str(exc)
        return
    for p in names:
        if p not in props:
            yield loc, (f"placeholder {{{p}}} names no parameter (parameters: "
                        f"{', '.join(sorted(props)) or 'none'})")
        elif (props[p] or {}).get("type") in ("object", "array"):
            yield loc, (f"placeholder {{{p}}} must be a string, number, integer or boolean "
                        "parameter")
