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
        default = next((v for v in (getattr(tool, info.policy), getattr(policy.limits,
                                                                        info.policy))
                        if v is not None), getattr(base, field))
        caps = [c for c in (getattr(tool, info.policy_max),
                            getattr(policy.limits, info.policy_max)) if c is not None]
        values[field] = min([default, *caps])
    return Limits(**values, network=network is not None).lowered_by(
        requested.asked() if requested is not None else None)


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
    if tool in BUILTIN_NAMES:
        cfg = getattr(spec.tools, tool)
        if cfg is not None and cfg.enabled:
            ctx.backend, ctx.kind = cfg.backend, BUILTIN_TOOLS[tool].kind
            if isinstance(cfg, PythonTool):
                return _decide_python(ctx, cfg, arguments)
            if isinstance(cfg, ShellTool):
                return decide_shell(ctx, cfg, _network(spec, cfg.network), arguments)
            if isinstance(cfg, BashTool):
                return decide_bash(ctx, cfg, _network(spec, cfg.network), arguments)
            if isinstance(cfg, JavascriptTool):
                return decide_javascript(ctx, tool, cfg, _network(spec, cfg.network),
                                         arguments)
            return _decide_file(ctx, cfg, arguments)
    elif tool in spec.custom_tools and spec.custom_tools[tool].enabled:
        custom = spec.custom_tools[tool]
        ctx.backend, ctx.kind = custom.backend, ToolKind.command
        return _decide_custom(ctx, custom, arguments)
    available = enabled_tools(pol)
    if tool in BUILTIN_NAMES and getattr(spec.tools, tool) is not None:
        rule = f"tools.{tool}.enabled"
    elif tool in spec.custom_tools:
        rule = f"custom_tools.{tool}.enabled"
    else:
        rule = "default_deny"
    return ctx.deny(rule, f"Tool `{tool}` is not available here; available tools: "
                          f"{listing(available)}.")


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
    if not node.args:
        return []
    func, arg = node.func, node.args[0]
    name = (func.id if isinstance(func, ast.Name)
            else func.attr if isinstance(func, ast.Attribute) else "")
    if (name in ("__import__", "import_module") and isinstance(arg, ast.Constant)
            and isinstance(arg.value, str)):
        return [(arg.value, [])]
    return []


_IMPORT_READERS: dict[type[ast.AST], Callable[[Any], Imported]] = {
    ast.Import: _plain_import, ast.ImportFrom: _from_import, ast.Call: _call_import}


def _decide_python(ctx: _Ctx, cfg: PythonTool, arguments: dict[str, Any]) -> Decision:
    rules = cfg.imports
    allowed_list = [m for m in rules.allow if m not in rules.deny]
    hint = ("any module" if "*" in rules.allow else listing(allowed_list))
    for module, fromlist in imported_modules(str(arguments.get("code", ""))):
        admitted, rule = import_verdict(module, rules.allow, rules.deny, fromlist)
        if rule == "relative":
            return ctx.deny("tools.python.imports",
                            "Relative imports are not available here; import modules by name.")
        if rule.startswith("deny"):
            name = denied_name(module, rules.deny, fromlist)
            return ctx.deny(f"tools.python.imports.{rule}",
                            f"Importing `{name}` is not allowed here; allowed modules: "
                            f"{hint}.")
        if not admitted:
            return ctx.deny("tools.python.imports.allow",
                            f"Importing `{module}` is not allowed here; allowed modules: {hint}.")
    return ctx.allow("tools.python", cfg.limits, _network(ctx.pol.spec, cfg.network),
                     egress=_egress(ctx.pol, cfg), image=cfg.image,
                     imports_allow=tuple(rules.allow), imports_deny=tuple(rules.deny))


# ------------------------------------------------------------------ shell


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
    for i, pattern in enumerate(cfg.paths.deny):
        if glob_match(pattern, path):
            return ctx.deny(f"tools.{tool}.paths.deny[{i}]",
                            f"Access to `{path}` is not allowed here (the policy protects it).")
    rule = next((f"tools.{tool}.paths.allow[{i}]" for i, pattern in enumerate(cfg.paths.allow)
                 if glob_match(pattern, path)), None)
    if rule is None:
        return ctx.deny(f"tools.{tool}.paths.allow",
                        f"Access to `{path}` is not allowed here; allowed paths: "
                        f"{listing(list(cfg.paths.allow))}.")
    if tool == "write_file":
        content = str(arguments.get("content", ""))
        size = (len(content) * 3 // 4 - content[-2:].count("=")  # what the base64 decodes to
                if arguments.get("encoding") == "base64"
                else len(content.encode("utf-8", "surrogatepass")))
        if size > cfg.max_bytes:
            return ctx.deny(f"tools.{tool}.max_bytes",
                            f"The content is {size} bytes; files may be at most "
                            f"{cfg.max_bytes} bytes here.")
    return ctx.allow(rule, cfg.limits, None)


# ------------------------------------------------------------------ admin-defined tools


def _as_arg(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _argv_element(tool: CustomTool, element: str, arguments: dict[str, Any],
                  props: dict[str, Any]) -> str | tuple[str] | None:
    """One ``argv`` element with its placeholders filled; None when an optional parameter
    was not given (and has no default): the element is dropped; ``(message,)`` when refused."""
    values: dict[str, str] = {}
    for name in placeholders(element):
        value = arguments.get(name, (props.get(name) or {}).get("default"))
        if value is None:
            return None
        if isinstance(value, dict | list):
            return (f"Argument `{name}` must be a string, number or boolean.",)
        values[name] = _as_arg(value)
    for name, value in values.items():
        if "\x00" in value:
            return (f"Argument `{name}` must not contain NUL characters.",)
    first = next(iter(string.Formatter().parse(element)), None)
    if (not tool.allow_option_values and first is not None and first[0] == ""
            and first[1] is not None and values[first[1]].startswith("-")):
        return (f"Argument `{first[1]}` must not start with `-` (it would be read as an "
                "option).",)
    # str.format never re-interprets the substituted values: one value, one element
    return element.format(**values)


def _decide_custom(ctx: _Ctx, tool: CustomTool, arguments: dict[str, Any]) -> Decision:
    base = f"custom_tools.{ctx.tool}"
    props = tool.parameters.get("properties") or {}
    argv: list[str] = []
    for i, element in enumerate(tool.argv):
        filled = _argv_element(tool, element, arguments, props)
        if isinstance(filled, tuple):
            return ctx.deny(f"{base}.argv[{i}]", filled[0])
        if filled is not None:
            argv.append(filled)
    wraps = wrapped_index(program_name(argv[0]) or "", argv)
    positions = [0] if wraps is None else [0, wraps]
    planned = harden(argv, positions)
    if isinstance(planned, str):
        return ctx.deny(base, f"{planned[0].upper()}{planned[1:]}.")
    return ctx.allow(base, tool.limits, _network(ctx.pol.spec, tool.network),
                     command=Plan(pipelines=(Pipeline(commands=(planned,)),)), image=tool.image,
                     egress=_egress(ctx.pol, tool))


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
