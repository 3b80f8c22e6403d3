"""What a policy offers: the enabled tools and their descriptions (``GET /v1/tools``)."""

from __future__ import annotations

import functools

from sandboxd.models import ToolSpec
from sandboxd.policy.loader import LoadedPolicy
from sandboxd.policy.models import (
    BUILTIN_NAMES,
    PACKAGES_TOOL,
    FileTool,
    PythonTool,
    ShellTool,
    allowed_packages,
)
from sandboxd.policy.units import format_size
from sandboxd.tools import BUILTIN_TOOLS, Hints

_MAX_LISTED = 40


def listing(names: list[str]) -> str:
    """Names joined by commas, the first forty, then how many more; ``none`` when empty."""
    if not names:
        return "none"
    shown = ", ".join(names[:_MAX_LISTED])
    return shown + (f", … ({len(names) - _MAX_LISTED} more)" if len(names) > _MAX_LISTED else "")


def enabled_tools(pol: LoadedPolicy) -> list[str]:
    """Names of the tools this policy enables (built-ins first, then admin-defined)."""
    names = [n for n in BUILTIN_NAMES
             if (cfg := getattr(pol.spec.tools, n)) is not None and cfg.enabled]
    if _packages_tool(pol) is not None:
        names.append(PACKAGES_TOOL)
    names += [n for n, t in pol.spec.custom_tools.items() if t.enabled]
    return names


def _packages_tool(pol: LoadedPolicy) -> PythonTool | None:
    """The python tool when it enables ``install_packages`` (packages allowed), else None."""
    python = pol.spec.tools.python
    return python if python is not None and python.enabled and python.packages.allow else None


def _python_hint(cfg: PythonTool) -> str:
    allow = cfg.imports.allow
    if "*" in allow:
        hint = " Any module may be imported"
        return hint + (f" except: {listing(cfg.imports.deny)}." if cfg.imports.deny else ".")
    return f" Allowed imports: {listing([m for m in allow if m not in cfg.imports.deny])}."


def _shell_hint(cfg: ShellTool) -> str:
    allowed = [c for c in cfg.commands.allow if c not in cfg.commands.deny]
    ops = ("Pipes, ';', '&&', '||' and redirects are allowed; there is no shell (no `$` "
           "variables, globs, comments or builtins such as cd)." if cfg.operators else
           "No shell operators: one program per call.")
    return f" Allowed commands: {listing(allowed)}. {ops}"


def tool_specs(pol: LoadedPolicy) -> list[ToolSpec]:
    """The tools this policy enables, as ``GET /v1/tools`` lists them."""
    return list(_tool_specs(pol))


@functools.lru_cache(maxsize=64)
def _tool_specs(pol: LoadedPolicy) -> tuple[ToolSpec, ...]:
    """Built once per loaded policy (a reload makes new LoadedPolicy objects): this is on the
    path of every call."""
    specs: list[ToolSpec] = []
    for name in BUILTIN_NAMES:
        cfg = getattr(pol.spec.tools, name)
        if cfg is None or not cfg.enabled:
            continue
        builtin = BUILTIN_TOOLS[name]
        description = builtin.description
        if isinstance(cfg, PythonTool):
            description += _python_hint(cfg)
        elif isinstance(cfg, ShellTool):
            description += _shell_hint(cfg)
        elif isinstance(cfg, FileTool) and name != "list_files":
            description += f" Files up to {format_size(cfg.max_bytes)}."
        network = getattr(cfg, "network", None) or pol.spec.network
        specs.append(ToolSpec(name=name, description=description,
                              parameters=builtin.parameters, backend=cfg.backend,
                              title=builtin.title,
                              annotations=builtin.hints.annotations(network)))
    python = _packages_tool(pol)
    if python is not None:
        builtin = BUILTIN_TOOLS[PACKAGES_TOOL]
        allowed = listing(sorted(allowed_packages(python.packages.allow).values()))
        specs.append(ToolSpec(name=PACKAGES_TOOL,
                              description=f"{builtin.description} Allowed packages: {allowed}.",
                              parameters=builtin.parameters, backend=python.backend,
                              title=builtin.title, annotations=builtin.hints.annotations("none")))
    for name, tool in pol.spec.custom_tools.items():
        if tool.enabled:
            hints = Hints(tool.annotations.read_only, tool.annotations.destructive,
                          tool.annotations.idempotent)
            specs.append(ToolSpec(name=name, description=tool.description,
                                  parameters=tool.parameters, backend=tool.backend,
                                  title=tool.title,
                                  annotations=hints.annotations(tool.network or pol.spec.network)))
    return tuple(specs)
