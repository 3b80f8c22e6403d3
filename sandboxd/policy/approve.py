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
    if not decision.allowed:
        return decision
    found: ApprovalRule | None = None
    python = spec.tools.python
    if tool == PACKAGES_TOOL and python is not None and python.packages.approve is not None:
        found = _rule(python.packages.approve, "tools.python.packages.approve")
    elif tool in BUILTIN_NAMES:
        cfg = getattr(spec.tools, tool)
        if cfg is not None and cfg.approve is not None:
            found = _matching(cfg.approve, f"tools.{tool}.approve", cfg, arguments)
    elif tool in spec.custom_tools and spec.custom_tools[tool].approve is not None:
        approve = spec.custom_tools[tool].approve
        assert approve is not None
        found = _rule(approve, f"custom_tools.{tool}.approve")
    return decision if found is None else decision.model_copy(update={"approve": found})


def _matching(approve: ApprovalSpec, rule: str, cfg: Any,
              arguments: dict[str, Any]) -> ApprovalRule | None:
    """A built-in tool's approval: every call, or (shell with ``patterns``) only a command
    line one of the patterns is found in."""
    if not isinstance(cfg, ShellTool) or not approve.patterns:
        return _rule(approve, rule)
    line = str(arguments.get("command", ""))
    for i, pattern in enumerate(approve.patterns):
        if re.search(pattern, line):
            return _rule(approve, f"{rule}.patterns[{i}]")
    return None
