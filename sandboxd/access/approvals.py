"""Approvals: an allowed call the policy gates (``approve:``) waits here for a person's yes.

The wait comes after the decision is audited and before the call asks the scheduler for a
slot, so a waiting call holds no execution slot. An approver answers over HTTP
(``POST /v1/approvals/{id}``), or, where the rule says ``elicit: true``, the calling MCP host's
user answers an elicitation (the MCP door sets :data:`ELICIT` for the call). Nobody answering
within the rule's ``approval_timeout_s`` expires the request. An approval scoped to the
session lets the same rule's later calls of that session run without asking until it lapses.
Every step is audited: ``approval_requested``, ``approval_decided``, ``approval_expired``, and
``approval_withdrawn`` (the caller went away while it waited: its result record says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

from sandboxd.models import (
    Approval,
    ApprovalRule,
    Cleanup,
    Decision,
    Reason,
    Result,
    Status,
    new_id,
)
from sandboxd.util.deadline import stop_task, within
from sandboxd.util.timefmt import utc_iso

#: what the MCP door lends a call whose host can answer an elicitation: ask it the question
#: (a text), get back "accept", "decline" or "cancel"
Elicit = Callable[[str], Awaitable[str]]
ELICIT: ContextVar[Elicit | None] = ContextVar("sandboxd_elicit", default=None)

#: the longest session-scoped approval (a day): a yes is not for ever
MAX_SCOPE_MINUTES = 24 * 60

Audit = Callable[..., Awaitable[Any]]
Finish = Callable[[str, Result, str], Awaitable[Any]]


class NotApprover(Exception):
    """The caller may not decide this approval (HTTP 403)."""


class UnknownApproval(Exception):
    """No pending approval has this id (HTTP 404): never one, or already decided or expired."""


@dataclass
class Pending:
    """One call waiting for an answer."""

    id: str
    invocation: str
    client: str
    tool: str
    session: str | None
    arguments: dict[str, Any]
    rule: ApprovalRule
    source: str
    transport: str
    requested_at: str
    expires_at: str
    answer: asyncio.Future[tuple[Approval, float]] = field(repr=False)

    def public(self) -> dict[str, Any]:
        """What an approver sees: what will run, where, under which rule, for whom."""
        return {"id": self.id, "invocation": self.invocation, "client": self.client,
                "tool": self.tool, "session": self.session, "arguments": self.arguments,
                "rule": self.rule.rule, "source": self.source, "approvers": self.rule.by,
                "transport": self.transport, "requested_at": self.requested_at,
                "expires_at": self.expires_at}

    def question(self) -> str:
        """The elicitation's text."""
        where = f"session {self.session}" if self.session else "a fresh workspace"
        return (f"sandboxd asks for approval: client '{self.client}' wants to run tool "
                f"'{self.tool}' with {self.arguments!r} in {where} (policy rule {self.rule.rule} "
                f"in {self.source}). Approve?")


class ApprovalBook:
    """Pending approvals and session-scoped grants of one daemon."""

    def __init__(self, audit: Audit, finish: Finish) -> None:
        self._audit = audit
        self._finish = finish  # audits a call's result (the service's own)
        self._pending: dict[str, Pending] = {}
        #: (client, session, source, rule) -> (monotonic end, the approval that granted it)
        self._grants: dict[tuple[str, str, str, str], tuple[float, Approval]] = {}

    def pending(self, approver: str, role: str | None = None) -> list[Pending]:
        """The pending approvals ``approver`` (whose token has ``role``) may decide, oldest
        first."""
        return [p for p in self._pending.values() if may_decide(p, approver, role)]

    async def gate(self, invocation: str, client: str, tool: str, session: str | None,
                   arguments: dict[str, Any], decision: Decision, transport: str,
                   admitted: float) -> tuple[Decision, float]:
        """Wait for the answer ``decision`` needs (none: returned as it is). Returns the
        decision (a denial when the answer was no or never came), with how the approval
        ended, and the time the call's own clock starts (a person's wait is not its
        timeout)."""
        need = decision.approve
        if need is None or not decision.allowed:
            return decision, admitted
        granted = self._granted(client, session, decision)
        if granted is not None:
            return decision.model_copy(update={"approval": granted}), time.monotonic()
        pending = Pending(
            id=new_id("apr"), invocation=invocation, client=client, tool=tool, session=session,
            arguments=arguments, rule=need, source=decision.source, transport=transport,
            requested_at=utc_iso(), expires_at=utc_iso(time.time() + need.timeout_s),
            answer=asyncio.get_running_loop().create_future())
        await self._audit(event="approval_requested", approval=pending.id,
                          request_id=invocation, client=client, tool=tool, session=session,
                          rule=need.rule, approvers=need.by, elicit=need.elicit,
                          timeout_s=need.timeout_s, transport=transport)
        approval, minutes = await self._wait(pending, decision)
        if approval.state != "approved":
            return _refused(decision, approval, need), admitted
        if approval.scope == "session" and session is not None:
            self._grants[(client, session, decision.source, need.rule)] = (
                time.monotonic() + minutes * 60, approval)
        return decision.model_copy(update={"approval": approval}), time.monotonic()

    async def _wait(self, pending: Pending, decision: Decision) -> tuple[Approval, float]:
        """The answer to ``pending`` and the minutes it covers; an expiry (audited) when none
        came in time. A caller that goes away meanwhile withdraws the request."""
        need = pending.rule
        self._pending[pending.id] = pending
        asker = self._elicit(pending) if need.elicit else None
        try:
            answered, got = await within(asyncio.shield(pending.answer), need.timeout_s)
        except asyncio.CancelledError:  # the caller went away (or a drain): nothing ran
            self._pending.pop(pending.id, None)
            await self._withdrawn(pending, decision)
            raise
        finally:
            self._pending.pop(pending.id, None)
            await stop_task(asker)
        if answered:
            return got
        if pending.answer.done():  # answered as the wait ran out: the answer stands
            return pending.answer.result()
        expired = Approval(id=pending.id, state="expired", at=utc_iso())
        await self._audit(event="approval_expired", approval=pending.id,
                          request_id=pending.invocation, client=pending.client,
                          tool=pending.tool, session=pending.session, rule=need.rule,
                          timeout_s=need.timeout_s)
        return expired, 0.0

    async def _withdrawn(self, pending: Pending, decision: Decision) -> None:
        """Audit a request whose caller went away, and its call's result (it never ran)."""
        approval = Approval(id=pending.id, state="withdrawn", at=utc_iso())
        result = Result.build(
            (pending.invocation, pending.tool, pending.session), decision.backend,
            Reason.cancelled, status=Status.killed, policy=decision.ref,
            limits=decision.limits, approval=approval,
            message="the call was cancelled while it waited for approval; nothing ran",
            cleanup=Cleanup(verified=True, detail="cancelled while waiting for approval"))
        with contextlib.suppress(Exception):  # a failing audit is the recorder's to report
            await self._audit(event="approval_withdrawn", approval=pending.id,
                              request_id=pending.invocation, client=pending.client,
                              tool=pending.tool, session=pending.session,
                              rule=pending.rule.rule)
            await self._finish(pending.client, result, pending.transport)

    async def decide(self, approval_id: str, approver: str, verdict: Literal["approve", "deny"],
                     reason: str | None = None, scope: Literal["call", "session"] = "call",
                     minutes: float = 0.0, role: str | None = None) -> Approval:
        """An approver's answer over HTTP (or the CLI)."""
        pending = self._pending.get(approval_id)
        if pending is None or pending.answer.done():
            raise UnknownApproval(approval_id)
        if not may_decide(pending, approver, role):
            raise NotApprover(approver)
        return await self._answer(pending, approver, verdict, reason, scope, minutes)

    async def _answer(self, pending: Pending, by: str, verdict: Literal["approve", "deny"],
                      reason: str | None, scope: Literal["call", "session"],
                      minutes: float) -> Approval:
        if pending.session is None:
            scope = "call"  # a call without a session has nothing later to cover
        approval = Approval(id=pending.id, state="approved" if verdict == "approve"
                            else "denied", by=by, reason=reason, at=utc_iso(),
                            scope=scope if verdict == "approve" else "call")
        # answered before the audit's await: a second answer meanwhile finds it taken
        self._pending.pop(pending.id, None)
        if not pending.answer.done():
            pending.answer.set_result((approval, min(minutes, MAX_SCOPE_MINUTES)))
        await self._audit(event="approval_decided", approval=pending.id,
                          request_id=pending.invocation, client=pending.client,
                          tool=pending.tool, session=pending.session, rule=pending.rule.rule,
                          decision=approval.state, by=by, reason=reason,
                          scope=approval.scope, minutes=minutes if approval.scope == "session"
                          else None)
        return approval

    def _elicit(self, pending: Pending) -> asyncio.Task[None] | None:
        """Ask the calling MCP host's user, if it can be asked; its answer decides."""
        ask = ELICIT.get()
        if ask is None:
            return None

        async def run() -> None:
            action = await ask(pending.question())
            if pending.answer.done():
                return
            verdict: Literal["approve", "deny"] = "approve" if action == "accept" else "deny"
            await self._answer(pending, f"{pending.client} (elicitation)", verdict,
                               None if action == "accept" else f"the host's user chose {action}",
                               "call", 0.0)

        return asyncio.create_task(run())

    def _granted(self, client: str, session: str | None, decision: Decision) -> Approval | None:
        """A session-scoped approval still covering this call's rule."""
        if session is None or decision.approve is None:
            return None
        key = (client, session, decision.source, decision.approve.rule)
        grant = self._grants.get(key)
        if grant is None:
            return None
        if time.monotonic() >= grant[0]:
            del self._grants[key]
            return None
        return grant[1]


def may_decide(pending: Pending, approver: str, role: str | None) -> bool:
    """A client the rule lists, or a token with the ``approvers`` role of another client than
    the caller's (nobody approves their own call unless the policy names them)."""
    return approver in pending.rule.by or (role == "approvers" and approver != pending.client)


def _refused(decision: Decision, approval: Approval, need: ApprovalRule) -> Decision:
    """The denial of a call whose approval was refused or never came, worded for a model."""
    if approval.state == "expired":
        message = (f"This call needs a person's approval (policy rule {need.rule}) and nobody "
                   f"answered within {need.timeout_s:g} s, so it did not run. Ask the user to "
                   "approve it (sandboxd approvals) and retry, or do without it.")
    else:
        why = f": {approval.reason}" if approval.reason else ""
        message = (f"This call needs a person's approval (policy rule {need.rule}) and "
                   f"{approval.by} denied it{why}. It did not run; do not retry it unchanged.")
    return decision.model_copy(update={"allowed": False, "message": message, "plan": None,
                                       "rule": need.rule, "approval": approval})
