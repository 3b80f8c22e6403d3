"""Decisions: is this call allowed by this policy, under which rule, with which limits.

Order of evaluation for every tool: the tool must be enabled (default deny); then deny rules,
then allow rules (deny beats allow; anything no allow rule admits is denied). Every decision
names the policy file (``source``) and the rule path (``tools.shell.commands.deny[2]``).
"""

from __future__ import annotations

import ast
import string
from collections.abc import Callable, Iterator
from typing import Any

from sandboxd.backends import registry
from sandboxd.egress.rules import EgressRules
from sandboxd.models import Decision, LimitsRequest
from sandboxd.policy import egress_checks
from sandboxd.policy.approve import gate as approval_gate
from sandboxd.policy.bash import decide_bash
from sandboxd.policy.javascript import decide_javascript
from sandboxd.policy.loader import LoadedPolicy
from sandboxd.policy.models import (
    BUILTIN_NAMES,
    PACKAGES_TOOL,
    BashTool,
    CustomTool,
    FileTool,
    ImportRules,
    JavascriptTool,
    LimitsSpec,
    PolicyFile,
    PythonTool,
    ShellTool,
    placeholders,
)
from sandboxd.policy.packages import decide_packages
from sandboxd.policy.paths import PathRefused, glob_match, normalise
from sandboxd.policy.programs import RUNS_OTHERS
from sandboxd.policy.shell import (
    program_name,
    wrapped_index,
)
from sandboxd.policy.shell_tool import decide_shell, harden
from sandboxd.policy.site import CallSite, at_site
from sandboxd.policy.specs import enabled_tools, listing
from sandboxd.protocol.limits import LIMITS, Limits
from sandboxd.protocol.plan import (
    ExecutionPlan,
    Pipeline,
    Plan,
    ToolKind,
)
from sandboxd.protocol.rules import denied_name, import_verdict
from sandboxd.tools import BUILTIN_TOOLS
from sandboxd.util.text import visible


def effective_limits(policy: PolicyFile, tool: LimitsSpec, requested: LimitsRequest | None,
                     network: str | None) -> Limits:
    """min(request, tool limit, policy maximum): the tool's value (or the policy's, or the
    built-in default) capped by the tool's and the policy's maxima, then lowered by the request."""
    base = Limits()
    values: dict[str, Any] = {}
    for field, info in LIMITS.items():
        default = [*_given(getattr(tool, info.policy), getattr(policy.limits, info.policy)),
                   getattr(base, field)][0]
        values[field] = min([default, *_given(getattr(tool, info.policy_max),
                                              getattr(policy.limits, info.policy_max))])
    return Limits(**values, network=network is not None).lowered_by(
        requested.asked() if requested is not None else None)


def _given(*values: Any) -> list[Any]:
    """The values a policy sets (None: left out), in order."""
    return [v for v in values if v is not None]


def _network(policy: PolicyFile, tool_network: str | None) -> str | None:
    net = tool_network or policy.network
    return None if net == "none" else net


def _egress(pol: LoadedPolicy, tool: Any) -> EgressRules | None:
    """The compiled egress rules of ``tool`` (its own block, else the policy's)."""
    spec = egress_checks.effective(tool, pol.spec)
    return spec.compiled(pol.name) if spec is not None else None


class _Ctx:
    """Builds the decisions of one call."""

    def __init__(self, pol: LoadedPolicy, tool: str, requested: LimitsRequest | None) -> None:
        self.pol = pol
        self.tool = tool
        self.requested = requested
        self.backend: str | None = None
        self.kind = ToolKind.python
        #: facts of the plan found on the way (a file tool's path and file cap)
        self.facts: dict[str, Any] = {}

    def egress(self, tool: Any) -> EgressRules | None:
        """The compiled egress rules of ``tool`` (its own block, else the policy's)."""
        return _egress(self.pol, tool)

    def deny(self, rule: str, message: str) -> Decision:
        return Decision(allowed=False, source=self.pol.source, rule=rule, message=message,
                        policy_name=self.pol.name, backend=self.backend,
                        policy_sha256=self.pol.sha256)

    def allow(self, rule: str, limits_spec: LimitsSpec, network: str | None,
              **fields: Any) -> Decision:
        """The allowed decision and its plan: what runs, with ``fields`` and the effective
        limits."""
        limits = effective_limits(self.pol.spec, limits_spec, self.requested, network)
        plan = ExecutionPlan(kind=self.kind, limits=limits, network=network,
                             **{**self.facts, **fields})
        return Decision(allowed=True, source=self.pol.source, rule=rule, policy_name=self.pol.name,
                        backend=self.backend, plan=plan, policy_sha256=self.pol.sha256)


def decide(pol: LoadedPolicy | None, client: str, tool: str, arguments: dict[str, Any],
           requested: LimitsRequest | None, site: CallSite | None = None) -> Decision:
    """The decision for one call by ``client`` (``arguments`` already schema-valid), with
    the person's approval an allowed call must wait for (``approve:``) if any, and the
    tool's rule on where the call runs (``site``; :mod:`sandboxd.policy.site`)."""
    decision = _decide(pol, client, tool, arguments, requested)
    decision = decision if pol is None else approval_gate(pol.spec, tool, arguments, decision)
    return at_site(tool, decision, site)


def _decide(pol: LoadedPolicy | None, client: str, tool: str, arguments: dict[str, Any],
            requested: LimitsRequest | None) -> Decision:
    if pol is None:
        return Decision(allowed=False, source="(no policy)", rule="clients",
                        message=f"No policy applies to client `{client}`: nothing is allowed.")
    ctx = _Ctx(pol, tool, requested)
    spec = pol.spec
    python = spec.tools.python
    if (tool == PACKAGES_TOOL and python is not None and python.enabled
            and python.packages.allow):
        ctx.backend, ctx.kind = python.backend, ToolKind.command
        return decide_packages(ctx, python, arguments)
    enabled = _enabled_tool(spec, tool)
    if enabled is None:
        return ctx.deny(_unavailable_rule(spec, tool), f"Tool `{tool}` is not available here; "
                        f"available tools: {listing(enabled_tools(pol))}.")
    cfg, ctx.kind = enabled
    ctx.backend = cfg.backend
    return _DECIDERS[type(cfg)](ctx, cfg, arguments)


def _enabled_tool(spec: PolicyFile, tool: str) -> tuple[Any, ToolKind] | None:
    """The block of the built-in or admin-defined tool ``tool`` and the kind of plan it
    makes; None unless the policy has the block and enables it."""
    if tool in BUILTIN_NAMES:
        cfg, kind = getattr(spec.tools, tool), BUILTIN_TOOLS[tool].kind
    else:
        cfg, kind = spec.custom_tools.get(tool), ToolKind.command
    return (cfg, kind) if cfg is not None and cfg.enabled else None


def _unavailable_rule(spec: PolicyFile, tool: str) -> str:
    """The rule that leaves ``tool`` unavailable: its block's ``enabled``, or default deny."""
    if tool in BUILTIN_NAMES and getattr(spec.tools, tool) is not None:
        return f"tools.{tool}.enabled"
    if tool in spec.custom_tools:
        return f"custom_tools.{tool}.enabled"
    return "default_deny"


# ------------------------------------------------------------------ python


def imported_modules(code: str) -> list[tuple[str, list[str]]]:
    """``[(module, [names of a from-import]), ...]`` imported by ``code``:
    import statements, and ``__import__("x")`` / ``importlib.import_module("x")`` with a
    literal name. Code that does not parse yields nothing (the backend reports the error)."""
    if code.isascii() and "import" not in code:
        # none of them without the word (an ASCII source: no identifier that NFKC-normalises
        # to ``__import__``), and no parse and walk of every call's code (most calls
        # import nothing, and the parse is daemon CPU paid on every call)
        return []
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        reader = _IMPORT_READERS.get(type(node))
        if reader is not None:
            found.extend(reader(node))
    return found


Imported = list[tuple[str, list[str]]]


def _plain_import(node: ast.Import) -> Imported:
    """``import a, b.c``."""
    return [(alias.name, []) for alias in node.names]


def _from_import(node: ast.ImportFrom) -> Imported:
    """``from m import x, y`` (with the names), or a relative import (dots kept)."""
    if node.level:
        return [("." * node.level + (node.module or ""), [])]
    return [(node.module, [a.name for a in node.names])] if node.module else []


def _call_import(node: ast.Call) -> Imported:
    """``__import__("m")`` or ``importlib.import_module("m")`` with a literal name."""
    match node:
        case ast.Call(func=ast.Name(id="__import__" | "import_module")
                      | ast.Attribute(attr="__import__" | "import_module"),
                      args=[ast.Constant(value=str() as module), *_]):
            return [(module, [])]
    return []


_IMPORT_READERS: dict[type[ast.AST], Callable[[Any], Imported]] = {
    ast.Import: _plain_import, ast.ImportFrom: _from_import, ast.Call: _call_import}


def _decide_python(ctx: _Ctx, cfg: PythonTool, arguments: dict[str, Any]) -> Decision:
    rules = cfg.imports
    for module, fromlist in imported_modules(str(arguments.get("code", ""))):
        refusal = _import_refusal(rules, module, fromlist)
        if refusal is not None:
            return ctx.deny(*refusal)
    return ctx.allow("tools.python", cfg.limits, _network(ctx.pol.spec, cfg.network),
                     egress=_egress(ctx.pol, cfg), image=cfg.image,
                     imports_allow=tuple(rules.allow), imports_deny=tuple(rules.deny))


def _import_refusal(rules: ImportRules, module: str,
                    fromlist: list[str]) -> tuple[str, str] | None:
    """Why importing ``module`` (``fromlist``: the names of a from-import) is refused (the rule
    and the message), or None when ``rules`` admit it."""
    admitted, rule = import_verdict(module, rules.allow, rules.deny, fromlist)
    if rule == "relative":
        return ("tools.python.imports",
                "Relative imports are not available here; import modules by name.")
    if rule.startswith("deny"):
        name = denied_name(module, rules.deny, fromlist)
        return (f"tools.python.imports.{rule}",
                f"Importing `{name}` is not allowed here; allowed modules: "
                f"{_modules_hint(rules)}.")
    if not admitted:
        return ("tools.python.imports.allow",
                f"Importing `{module}` is not allowed here; allowed modules: "
                f"{_modules_hint(rules)}.")
    return None


def _modules_hint(rules: ImportRules) -> str:
    """What a refusal says may be imported instead."""
    if "*" in rules.allow:
        return "any module"
    return listing([m for m in rules.allow if m not in rules.deny])


# ------------------------------------------------------------------ file tools


def _decide_file(ctx: _Ctx, cfg: FileTool, arguments: dict[str, Any]) -> Decision:
    tool = ctx.tool
    ctx.facts["max_file_bytes"] = cfg.max_bytes
    raw = str(arguments.get("path", "."))
    try:
        path = normalise(raw)
    except PathRefused as exc:
        return ctx.deny(f"tools.{tool}.paths",
                        f"The path `{visible(raw)}` is not allowed: {exc}.")
    ctx.facts["path"] = path
    rule = _path_rule(ctx, cfg, path)
    if isinstance(rule, Decision):
        return rule
    if tool == "write_file" and (size := _content_size(arguments)) > cfg.max_bytes:
        return ctx.deny(f"tools.{tool}.max_bytes",
                        f"The content is {size} bytes; files may be at most "
                        f"{cfg.max_bytes} bytes here.")
    return ctx.allow(rule, cfg.limits, None)


def _path_rule(ctx: _Ctx, cfg: FileTool, path: str) -> str | Decision:
    """The allow rule admitting the workspace path ``path``; the denial when a deny pattern
    matches it or no allow pattern does."""
    tool = ctx.tool
    denied = _first_match(cfg.paths.deny, path)
    if denied is not None:
        return ctx.deny(f"tools.{tool}.paths.deny[{denied}]",
                        f"Access to `{path}` is not allowed here (the policy protects it).")
    allowed = _first_match(cfg.paths.allow, path)
    if allowed is None:
        return ctx.deny(f"tools.{tool}.paths.allow",
                        f"Access to `{path}` is not allowed here; allowed paths: "
                        f"{listing(list(cfg.paths.allow))}.")
    return f"tools.{tool}.paths.allow[{allowed}]"


def _first_match(patterns: list[str], path: str) -> int | None:
    """The index of the first of the glob ``patterns`` that matches ``path``, if any."""
    return next((i for i, pattern in enumerate(patterns) if glob_match(pattern, path)), None)


def _content_size(arguments: dict[str, Any]) -> int:
    """The bytes a ``write_file`` call's content writes (what its base64 decodes to)."""
    content = str(arguments.get("content", ""))
    if arguments.get("encoding") == "base64":
        return len(content) * 3 // 4 - content[-2:].count("=")
    return len(content.encode("utf-8", "surrogatepass"))


# ------------------------------------------------------------------ admin-defined tools


def _as_arg(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _argv_element(tool: CustomTool, element: str, arguments: dict[str, Any],
                  props: dict[str, Any]) -> str | tuple[str] | None:
    """One ``argv`` element with its placeholders filled; None when an optional parameter
    was not given (and has no default): the element is dropped; ``(message,)`` when refused."""
    values = _placeholder_values(element, arguments, props)
    if not isinstance(values, dict):
        return values
    refusal = _value_refusal(tool, element, values)
    # str.format never re-interprets the substituted values: one value, one element
    return element.format(**values) if refusal is None else (refusal,)


def _placeholder_values(element: str, arguments: dict[str, Any],
                        props: dict[str, Any]) -> dict[str, str] | tuple[str] | None:
    """The text of each placeholder's argument (else its parameter's default), in order: None
    at the first with neither, ``(message,)`` at the first that is an object or an array."""
    values: dict[str, str] = {}
    for name in placeholders(element):
        value = arguments.get(name, (props.get(name) or {}).get("default"))
        if value is None:
            return None
        if isinstance(value, dict | list):
            return (f"Argument `{name}` must be a string, number or boolean.",)
        values[name] = _as_arg(value)
    return values


def _value_refusal(tool: CustomTool, element: str, values: dict[str, str]) -> str | None:
    """Why the filled ``values`` may not make ``element``: a NUL, or a value that starts the
    element with ``-`` (read as an option) unless the tool allows option values."""
    nul = next((name for name, value in values.items() if "\x00" in value), None)
    if nul is not None:
        return f"Argument `{nul}` must not contain NUL characters."
    leading = _leading_placeholder(element)
    if not tool.allow_option_values and leading is not None and values[leading].startswith("-"):
        return (f"Argument `{leading}` must not start with `-` (it would be read as an "
                "option).")
    return None


def _leading_placeholder(element: str) -> str | None:
    """The placeholder ``element`` starts with (no text before it), if any."""
    first = next(iter(string.Formatter().parse(element)), None)
    return first[1] if first is not None and first[0] == "" else None


def _decide_custom(ctx: _Ctx, tool: CustomTool, arguments: dict[str, Any]) -> Decision:
    base = f"custom_tools.{ctx.tool}"
    argv = _custom_argv(ctx, tool, arguments)
    if isinstance(argv, Decision):
        return argv
    wraps = wrapped_index(program_name(argv[0]) or "", argv)
    positions = [0] if wraps is None else [0, wraps]
    planned = harden(argv, positions)
    if isinstance(planned, str):
        return ctx.deny(base, f"{planned[0].upper()}{planned[1:]}.")
    return ctx.allow(base, tool.limits, _network(ctx.pol.spec, tool.network),
                     command=Plan(pipelines=(Pipeline(commands=(planned,)),)), image=tool.image,
                     egress=_egress(ctx.pol, tool))


def _custom_argv(ctx: _Ctx, tool: CustomTool, arguments: dict[str, Any]) -> list[str] | Decision:
    """The admin-defined tool's argv template filled with the call's ``arguments`` (elements
    of optional parameters left out dropped), or the denial of the first refused element."""
    props = tool.parameters.get("properties") or {}
    argv: list[str] = []
    for i, element in enumerate(tool.argv):
        filled = _argv_element(tool, element, arguments, props)
        if isinstance(filled, tuple):
            return ctx.deny(f"custom_tools.{ctx.tool}.argv[{i}]", filled[0])
        if filled is not None:
            argv.append(filled)
    return argv


#: each tool block's decision, by the block's type (the network is the one the tool is granted)
_DECIDERS: dict[type[Any], Callable[[_Ctx, Any, dict[str, Any]], Decision]] = {
    PythonTool: _decide_python,
    FileTool: _decide_file,
    CustomTool: _decide_custom,
    ShellTool: lambda ctx, cfg, arguments: decide_shell(
        ctx, cfg, _network(ctx.pol.spec, cfg.network), arguments),
    BashTool: lambda ctx, cfg, arguments: decide_bash(
        ctx, cfg, _network(ctx.pol.spec, cfg.network), arguments),
    JavascriptTool: lambda ctx, cfg, arguments: decide_javascript(
        ctx, ctx.tool, cfg, _network(ctx.pol.spec, cfg.network), arguments),
}


# ------------------------------------------------------------------ admin warnings

Warning = tuple[tuple[str | int, ...], str]  # (where in the file, what to look at)


def _shell_warnings(shell: ShellTool | None) -> Iterator[Warning]:
    """Allowed programs that run other programs, and operators switched on."""
    if shell is None or not shell.enabled:
        return
    for i, name in enumerate(shell.commands.allow):
        if name in RUNS_OTHERS and name not in shell.commands.deny:
            yield (("tools", "shell", "commands", "allow", i),
                   f"`{name}` is {RUNS_OTHERS[name]}: whatever it runs is not checked "
                   "against this list (the container is the barrier)")
    if shell.operators:
        yield (("tools", "shell", "operators"), "shell operators are enabled: pipes, ';', "
               "'&&', '||' and redirects are executed by sandboxd, without a shell (every "
               "program is still checked)")


def _python_warnings(python: PythonTool | None) -> Iterator[Warning]:
    """Every module importable, and packages allowed where they cannot be installed."""
    if python is None:
        return
    if python.enabled and "*" in python.imports.allow:
        yield ("tools", "python", "imports", "allow"), "every module may be imported"
    entry = registry.get(python.backend)
    if python.packages.allow and entry is not None and entry.offered_modules() is not None:
        yield (("tools", "python", "packages", "allow"), f"install_packages is refused on the "
               f"{python.backend} backend (its python offers a fixed set of modules)")


def policy_warnings(pol: LoadedPolicy) -> list[str]:
    """Things that are valid but worth an admin's second look (``file:line:col: warning:``)."""
    spec = pol.spec
    found = [*_shell_warnings(spec.tools.shell), *_python_warnings(spec.tools.python)]
    if spec.network != "none":
        found.append((("network",), f"network {spec.network!r} is granted to every container "
                      "tool"))
    out: list[str] = []
    for loc, text in found:
        line, col = pol.position(loc)
        out.append(f"{pol.source}:{line}:{col}: warning: {text}")
    return out
