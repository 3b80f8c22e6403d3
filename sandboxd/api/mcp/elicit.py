"""The MCP door's half of approvals: a host that declared the elicitation capability is asked
(``elicitation/create``, a form) whether a gated call may run, where the rule lets the
calling host's user answer (``approve: {elicit: true}``; :mod:`sandboxd.access.approvals`)."""

from __future__ import annotations

import contextvars
import logging
from typing import Any

from sandboxd.access.approvals import ELICIT, Elicit

log = logging.getLogger("sandboxd.mcp")

#: the form: one yes/no the host's user answers
FORM: dict[str, Any] = {
    "type": "object",
    "properties": {"approve": {"type": "boolean", "title": "Run this call?",
                               "description": "Yes runs it once; no refuses it."}},
    "required": ["approve"],
}


def elicitor(ctx: Any) -> Elicit | None:
    """Ask this request's host (None: it cannot be asked)."""
    caps = ctx.session.client_capabilities
    if caps is None or getattr(caps, "elicitation", None) is None:
        return None

    async def ask(question: str) -> str:
        try:
            answer = await ctx.session.elicit_form(question, FORM,
                                                   related_request_id=ctx.request_id)
        except Exception as exc:  # no back channel, a broken host: the approvers still may
            log.info("elicitation failed, the call waits for an approver: %s", exc)
            raise
        if answer.action == "accept" and (answer.content or {}).get("approve") is True:
            return "accept"
        return "cancel" if answer.action == "cancel" else "decline"

    return ask


def call_context(ctx: Any) -> contextvars.Context:
    """The context a tools/call's service task runs in: with the host to ask, if any."""
    context = contextvars.copy_context()
    context.run(ELICIT.set, elicitor(ctx))
    return context

