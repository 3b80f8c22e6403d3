"""``/v1/approvals``: the calls waiting for a person's yes, and the answer (docs/api.md).

Only an approver of a request (a client its rule lists in ``approve.by``, or a token with the
``approvers`` role of another client than the caller's) sees it and may decide it; anyone else
gets 403 problem+json, an id nothing waits under 404.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from sandboxd.access.approvals import (
    MAX_SCOPE_MINUTES,
    ApprovalBook,
    NotApprover,
    UnknownApproval,
)
from sandboxd.api.auth import authenticate
from sandboxd.api.problems import Problem
from sandboxd.models import Approval

router = APIRouter()


def _role(request: Request) -> str | None:
    """The role of the (already authenticated) caller's token; None without tokens."""
    tokens = request.app.state.tokens
    if tokens is None:
        return None
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    entry = tokens.entry_for(token.strip()) if scheme.lower() == "bearer" else None
    return entry.role if entry is not None else None


class ApprovalAnswer(BaseModel):
    """Body of ``POST /v1/approvals/{id}``."""

    model_config = ConfigDict(extra="forbid")
    decision: Literal["approve", "deny"]
    reason: str | None = Field(default=None, max_length=1000)
    scope: Literal["call", "session"] = "call"
    minutes: float = Field(default=10.0, gt=0, le=MAX_SCOPE_MINUTES,
                           description="how long a session-scoped approval lasts")


@router.get("/v1/approvals", tags=["approvals"])
async def list_approvals(request: Request,
                         client: str = Depends(authenticate)) -> list[dict[str, Any]]:
    """The pending approvals this client may decide: what will run, where, under which rule."""
    book = request.app.state.service.approvals
    return [p.public() for p in book.pending(client, _role(request))]


@router.post("/v1/approvals/{approval_id}", tags=["approvals"])
async def decide_approval(approval_id: str, body: ApprovalAnswer, request: Request,
                          client: str = Depends(authenticate)) -> Approval:
    """Approve or deny one pending call (a session scope covers that session's later calls
    under the same rule for ``minutes``)."""
    book: ApprovalBook = request.app.state.service.approvals
    try:
        return await book.decide(approval_id, client, body.decision, body.reason, body.scope,
                                 body.minutes, _role(request))
    except UnknownApproval:
        raise Problem(404, "approval-not-found", "No such pending approval",
                      f"no call waits for approval '{approval_id}': it was never requested, "
                      "or it was already decided or expired") from None
    except NotApprover:
        raise Problem(403, "not-an-approver", "Not an approver",
                      f"client '{client}' may not decide approval '{approval_id}': its policy "
                      "rule lists other approvers (approve.by), and this token has no "
                      "approvers role (or the call is its own client's)") from None
