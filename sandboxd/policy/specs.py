"""What a policy offers: the enabled tools and their descriptions (``GET /v1/tools``)."""

from __future__ import annotations

import functools
from typing import Any

from sandboxd.models import ToolSpec
from sandboxd.policy.loader import LoadedPolicy
from sandboxd.policy.models import (
    BUILTIN_NAMES,
    PACKAGES_TOOL,
    BashTool,
    CustomTool,
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


def tool_network(pol: LoadedPolicy, cfg: Any) -> str:
    """The network a tool's calls get: the tool's own ``network``, else the policy's."""
    return getattr(cfg, "network", None) or pol.spec.network


def _enabled_builtins(pol: LoadedPolicy) -> list[tuple[str, Any]]:
    """The built-in tools this policy enables, with their settings, in the table's order."""
    return [(n, cfg) for n in BUILTIN_NAMES
            if (cfg := getattr(pol.spec.tools, n)) is not None and cfg.enabled]


def _enabled_custom(pol: LoadedPolicy) -> list[tuple[str, CustomTool]]:
    """The admin-defined tools this policy enables, in its order."""
    return [(n, t) for n, t in pol.spec.custom_tools.items() if t.enabled]


def enabled_tools(pol: LoadedPolicy) -> list[str]:
    """Names of the tools this policy enables (built-ins first, then admin-defined)."""
    names = [n for n, _ in _enabled_builtins(pol)]
    if _packages_tool(pol) is not None:
        names.append(PACKAGES_TOOL)
    return names + [n for n, _ in _enabled_custom(pol)]


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


def _runnable(shell: ShellTool) -> list[str]:
    """The programs the shell tool's rules allow (its allowlist less its denylist)."""
    return [c for c in shell.commands.allow if c not in shell.commands.deny]


def _shell_hint(cfg: ShellTool) -> str:
    ops = ("Pipes, ';', '&&', '||' and redirects are allowed; there is no shell (no `$` "
           "variables, globs, comments or builtins such as cd)." if cfg.operators else
           "No shell operators: one program per call.")
    return f" Allowed commands: {listing(_runnable(cfg))}. {ops}"


def _hint(pol: LoadedPolicy, name: str, cfg: Any) -> str:
    """What the policy adds to a built-in tool's description: the imports, commands or
    programs it allows, the size of the files it handles (nothing for the others)."""
    shell = pol.spec.tools.shell
    if isinstance(cfg, PythonTool):
        return _python_hint(cfg)
    if isinstance(cfg, ShellTool):
        return _shell_hint(cfg)
    if isinstance(cfg, BashTool):  # (bash runs the programs the shell tool allows)
        return f" Programs it may run: {listing(_runnable(shell))}." if shell is not None else ""
    if isinstance(cfg, FileTool) and name != "list_files":
        return f" Files up to {format_size(cfg.max_bytes)}."
    return ""


def tool_specs(pol: LoadedPolicy) -> list[ToolSpec]:
    """The tools this policy enables, as ``GET /v1/tools`` lists them."""
    return list(_tool_specs(pol))


@functools.lru_cache(maxsize=64)
def _tool_specs(pol: LoadedPolicy) -> tuple[ToolSpec, ...]:
    """Built once per loaded policy (a reload makes new LoadedPolicy objects): this is on the
    path of every call."""
    python = _packages_tool(pol)
    return (*(_builtin_spec(pol, name, cfg) for name, cfg in _enabled_builtins(pol)),
            *([_packages_spec(python)] if python is not None else []),
            *(_custom_spec(pol, name, tool) for name, tool in _enabled_custom(pol)))


def _builtin_spec(pol: LoadedPolicy, name: str, cfg: Any) -> ToolSpec:
    """A built-in tool as listed: its description with what the policy allows it."""
    builtin = BUILTIN_TOOLS[name]
    return ToolSpec(name=name, description=builtin.description + _hint(pol, name, cfg),
                    parameters=builtin.parameters, backend=cfg.backend, title=builtin.title,
                    annotations=builtin.hints.annotations(tool_network(pol, cfg)))


def _packages_spec(python: PythonTool) -> ToolSpec:
    """``install_packages`` as listed: with the packages the python tool allows."""
    builtin = BUILTIN_TOOLS[PACKAGES_TOOL]
    allowed = listing(sorted(allowed_packages(python.packages.allow).values()))
    return ToolSpec(name=PACKAGES_TOOL,
                    description=f"{builtin.description} Allowed packages: {allowed}.",
                    parameters=builtin.parameters, backend=python.backend,
                    title=builtin.title, annotations=builtin.hints.annotations("none"))


def _custom_spec(pol: LoadedPolicy, name: str, tool: CustomTool) -> ToolSpec:
    """An admin-defined tool as listed: its own description, parameters and hints."""
    hints = Hints(tool.annotations.read_only, tool.annotations.destructive,
                  tool.annotations.idempotent)
    return ToolSpec(name=name, description=tool.description, parameters=tool.parameters,
                    backend=tool.backend, title=tool.title,
                    annotations=hints.annotations(tool_network(pol, tool)))
