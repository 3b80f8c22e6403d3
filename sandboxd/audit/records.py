"""What the two records of every call say: the fields of a ``decision`` record (before anything
runs) and of a ``result`` record (its outcome), built from the decision and the result; the
writer (:mod:`.writer`) chains and appends them."""

from __future__ import annotations

import hashlib
from typing import Any

from sandboxd.audit.encoding import PREVIEW_CHARS, cap, preview
from sandboxd.models import Decision, Result


def decision_fields(*, request_id: str, client: str, tool: str, session: str | None,
                    arguments: dict[str, Any], canonical: bytes, decision: Decision,
                    transport: str) -> dict[str, Any]:
    """The fields of a call's ``decision`` record, in the record's order; ``canonical``:
    the arguments' canonical JSON (``args_sha256``, its SHA-256, is what the call's receipt
    names)."""
    return {
        "request_id": request_id,
        "client": client,
        "tool": tool,
        "session": session,
        "transport": transport,
        "args_sha256": hashlib.sha256(canonical).hexdigest(),
        "args_bytes": len(canonical),
        "args_preview": preview(arguments),
        "decision": "allow" if decision.allowed else "deny",
        "source": decision.source,
        "rule": decision.rule,
        "policy": decision.policy_name,
        "backend": decision.backend,
        "limits": decision.limits.to_wire() if decision.limits else None,
        **_decision_details(decision),
    }


def result_fields(*, request_id: str, client: str, result: Result,
                  transport: str) -> dict[str, Any]:
    """The fields of a call's ``result`` record, in the record's order: what ran, how it
    ended, what it used, and the sizes (never the content) of what it wrote."""
    return dict(
        request_id=request_id,
        client=client,
        transport=transport,
        tool=result.tool,
        invocation=result.id,
        session=result.session,
        backend=result.backend,
        status=result.status.value,
        termination=result.termination.model_dump(mode="json"),
        resources=result.resources.model_dump(mode="json"),
        limits=result.limits.to_wire() if result.limits else None,
        rule=result.policy.rule if result.policy else None,
        stdout_bytes=len(result.stdout.encode("utf-8", "replace")),
        stderr_bytes=len(result.stderr.encode("utf-8", "replace")),
        displays=len(result.outputs),  # display items (their content is not logged)
        truncated=result.truncated.model_dump(mode="json"),
        cleanup=result.cleanup.model_dump(mode="json"),
        # a session call's kernel as the call left it (kept, interrupted or lost)
        kernel=result.kernel.model_dump(mode="json") if result.kernel else None,
        message=cap(result.message),
    )


def _what_runs(plan: Any) -> dict[str, Any]:
    """A preview of what an allowed call runs: its argv, else its command plan."""
    if plan.argv is not None:
        return {"argv_preview": preview(plan.argv)}
    if plan.command is not None:
        return {"plan_preview": cap(plan.command.render(), PREVIEW_CHARS)}
    return {}


def _decision_details(decision: Decision) -> dict[str, Any]:
    """The optional fields of a decision record, in the record's order: the network, what an
    allowed call runs, a denial's message, the approval rule the call waits for."""
    details: dict[str, Any] = {}
    plan = decision.plan
    if plan is not None and plan.network:
        details["network"] = plan.network
    if not decision.allowed:
        details["message"] = cap(decision.message)
    elif plan is not None:
        details |= _what_runs(plan)
    if decision.approve is not None:  # it waits for a person's yes (approval_* records)
        details["approve"] = decision.approve.rule
    return details
