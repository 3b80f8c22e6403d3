"""The results the invoke path makes itself for an admitted call its backend did not answer:
refused once admitted (no kernel, no uid, no slot), found its session ended before it
started, cut by a cancel (its caller's, a drain's or its session's end), or failed inside
the daemon. Each is the call's own result, audited like any other."""

from __future__ import annotations

import asyncio

from sandboxd.backends.base import CancelledAfterCleanup
from sandboxd.invoke.execute import AdmittedCall, own_result
from sandboxd.invoke.steps import finish, result_steps
from sandboxd.models import Cleanup, Reason, Result, Status

#: the message of a call its session's end cancelled (delete, expiry, revocation)
SESSION_ENDED = "the session ended (deleted, expired or its client revoked) during the call"
#: the cleanup of a call stopped before anything of it ran
NOT_STARTED = "cancelled before it started"


def stopped(call: AdmittedCall, status: Status, reason: Reason, message: str | None) -> Result:
    """The call's result, made by the invoke path (nothing of it ran to an answer)."""
    return own_result(call.id, call.tool, call.decision, call.request.session, status, reason,
                      message)


def not_started(call: AdmittedCall, message: str) -> Result:
    """A call that found its session ended before it started: nothing ran."""
    result = stopped(call, Status.killed, Reason.cancelled, message)
    result.cleanup = Cleanup(verified=True, detail=NOT_STARTED)
    return result


def cancelled(call: AdmittedCall, exc: asyncio.CancelledError, admitted: float,
              started: bool) -> Result:
    """A call cut by a cancel: its wall time is the time it was in the daemon's hands until
    then; its cleanup is what the backend verified (a :class:`CancelledAfterCleanup`, with the
    kernel it kept or lost), or nothing to clean when it was still queued (``started``
    false)."""
    result = own_result(call.id, call.tool, call.decision, call.request.session,
                        Status.killed, Reason.cancelled, None, started=admitted)
    if isinstance(exc, CancelledAfterCleanup):
        result.cleanup = exc.cleanup
        if exc.kernel is not None:
            result.kernel = exc.kernel
            result = finish(result, result_steps())
    elif not started:
        result.cleanup = Cleanup(verified=True, detail=NOT_STARTED)
    return result
