"""Which allowed calls wait for a person's yes (``approve:``, docs/policy.md).

The policy first decides as always (deny beats allow; a denied call is never sent for
approval); an allowed call whose rule carries ``approve:`` then carries an
:class:`~sandboxd.models.ApprovalRule` on its decision, and the service holds it until an
approver answers (:mod:`sandboxd.access.approvals`).
"""

from __future__ import annotations

import re
from typing import Any

from sandboxd.models import ApprovalRule, Decision
from sandboxd.policy.models import (
    BUILTIN_NAMES,
    PACKAGES_TOOL,
    ApprovalSpec,
    PolicyFile,
    ShellTool,
)


def _rule(spec: ApprovalSpec, rule: str) -> ApprovalRule:
    return ApprovalRule(rule=rule, by=list(spec.by), elicit=spec.elicit,
                        timeout_s=spec.approval_timeout_s)


def gate(spec: PolicyFile, tool: str, arguments: dict[str, Any], decision: Decision) -> Decision:
    """``decision`` with the approval it needs, if any (only an allowed call can need one)."""
    found = _approval(spec, tool, arguments) if decision.allowed else None
    return decision if found is None else decision.model_copy(update={"approve": found})


def _approval(spec: PolicyFile, tool: str, arguments: dict[str, Any]) -> ApprovalRule | None:
    """The approval a call of ``tool`` needs: the packages tool's, else the ``approve:`` of
    the built-in or admin-defined tool of that name (a built-in first), else none."""
    python = spec.tools.python
    if tool == PACKAGES_TOOL and python is not None and python.packages.approve is not None:
        return _rule(python.packages.approve, "tools.python.packages.approve")
    cfg, where = ((getattr(spec.tools, tool), "tools") if tool in BUILTIN_NAMES
                  else (spec.custom_tools.get(tool), "custom_tools"))
    if cfg is None or cfg.approve is None:
        return None
    return _matching(cfg.approve, f"{where}.{tool}.approve", cfg, arguments)


def _matching(approve: ApprovalSpec, rule: str, cfg: Any,
              arguments: dict[str, Any]) -> ApprovalRule | None:
    """A tool's approval: every call, or (shell with ``patterns``) only a command line one of
    the patterns is found in."""
    if not isinstance(cfg, ShellTool) or not approve.patterns:
        return _rule(approve, rule)
    line = str(arguments.get("command", ""))
    for i, pattern in enumerate(approve.patterns):
        if re.search(pattern, line):
            return _rule(approve, f"{rule}.patterns[{i}]")
    return None
