"""The verdict on a session kernel call, one definition for every backend.

A backend only gathers what it observed of the call (:class:`Observed`: how the call ended,
whether the kernel came back to its loop proven idle, was interrupted, was ended from outside,
crashed); :func:`kernel_verdict` turns that into what the result reports: the
:class:`~sandboxd.models.Kernel` (kept, interrupted, or lost and why), the cleanup detail of a
kept kernel and the sentence a lost one's result carries. It is pure (no process, no I/O), so
that every branch is a row of a table test rather than a path through a backend.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sandboxd.models import Kernel, Reason

#: ``cleanup.detail`` of a call after which its session's kernel lives on, on purpose
KEPT = "the session's kernel was kept for its next call"
#: ``cleanup.detail`` of a call whose code was interrupted and whose kernel came back
KEPT_INTERRUPTED = ("the call's code was interrupted and the kernel came back to its loop "
                    "(proven idle): it was kept for the session's next call")
#: ``cleanup.detail`` of a cancelled call that ended by itself as it was interrupted
KEPT_CANCELLED = ("the call ended as it was cancelled; the session's kernel was kept for its "
                  "next call")
#: ``cleanup.detail`` of a kept kernel whose call's processes are not proven gone
LEFT = "processes of the call may be left"


class Ended(enum.Enum):
    """How the call ended, as the daemon saw it; the value is a lost kernel's ``reason``
    when the call never came to a result of its own."""

    #: the call came to a result (its termination reason is known)
    FINISHED = "finished"
    #: the call was cancelled (its client went away, the session ended)
    CANCELLED = "cancelled"
    #: its deadline passed before the sandbox answered at all
    TIMEOUT = "wall_timeout"
    #: the paused session container could not be thawed for it
    THAW_FAILED = "thaw_failed"

    @property
    def reason(self) -> str:
        """The value, typed (mypy calls a narrowed member's ``.value`` Any)."""
        return self.value


@dataclass(frozen=True)
class Observed:
    """What the daemon observed of one session kernel call."""

    ended: Ended
    #: the kernel was started by this call
    fresh: bool
    #: calls run in the kernel so far, this one included
    calls: int
    #: the session has a kernel to speak of (a container call without one has none)
    has_kernel: bool = True
    #: the kernel is back in its loop, proven idle, within every limit: it is kept
    back: bool = False
    #: the call's code was interrupted (at its deadline, a cancel, a request)
    interrupted: bool = False
    #: the call's processes are proven gone
    verified: bool = True
    #: why it was ended from outside during the call (a restart, the session closed)
    stopped: str | None = None
    #: what showed that it was not idle after its report (e.g. a thread left running)
    not_idle: str | None = None
    #: its process died by itself (a lost kernel's reason is then ``crashed``)
    crashed: bool = False
    #: the signal that killed it, or its exit status (for the sentence)
    signal: int | None = None
    exit_code: int | None = None
    #: the call's termination reason, when it came to a result that has one (its message
    #: then says why; without one, the kernel's own end says it)
    termination: Reason | None = None
    #: the image whose runner predates session kernels (it ran the call as a one-shot one)
    old_runner: str | None = None


@dataclass(frozen=True)
class Verdict:
    """What a result reports of its session kernel."""

    #: None when the session has no kernel to speak of
    kernel: Kernel | None
    #: ``cleanup.detail`` of a kept kernel
    detail: str | None = None
    #: the sentence a result without a message of its own carries (why the kernel is gone)
    why: str | None = None
    #: the message that replaces the result's own
    message: str | None = None


def kernel_verdict(seen: Observed) -> Verdict:
    """The :class:`Kernel` a session call reports, and what its result says of it."""
    if not seen.has_kernel:
        return Verdict(None)
    if seen.old_runner is not None:
        return Verdict(Kernel(fresh=True, calls=1, lost=True, reason="unsupported"),
                       message=f"the runner of the sandbox image {seen.old_runner} predates "
                               "session kernels, so Python state is not kept between calls; "
                               "rebuild the image (sandboxd images build)")
    if seen.back:
        return Verdict(Kernel(fresh=seen.fresh, calls=seen.calls, interrupted=seen.interrupted),
                       detail=_kept_detail(seen))
    return Verdict(Kernel(fresh=seen.fresh, calls=seen.calls, lost=True,
                          reason=_lost_reason(seen)), why=_why(seen))


def _kept_detail(seen: Observed) -> str:
    if not seen.verified:
        return LEFT
    if seen.interrupted:
        return KEPT_INTERRUPTED
    return KEPT_CANCELLED if seen.ended is Ended.CANCELLED else KEPT


def _lost_reason(seen: Observed) -> str:
    """A call that never came to a result is lost for how it ended; one that did, for what
    ended its kernel: from outside, not idle, a crash, else the call's termination."""
    if seen.ended is not Ended.FINISHED:
        return seen.ended.reason
    if seen.stopped:
        return seen.stopped
    if seen.not_idle:
        return "not_idle"
    if seen.crashed or seen.termination is None:
        return "crashed"
    return seen.termination.value


def _why(seen: Observed) -> str | None:
    """Why the kernel is gone, when nothing else says it: a call without a result of its
    own, or whose result has a termination reason, says it there."""
    if seen.ended is not Ended.FINISHED or seen.termination is not None:
        return None
    if seen.stopped:
        return f"the session's kernel was {seen.stopped} during the call"
    if seen.not_idle:
        return f"the Python interpreter was not idle after the call: {seen.not_idle}"
    if seen.signal:
        return f"the Python interpreter was killed by signal {seen.signal}"
    return f"the Python interpreter exited with status {seen.exit_code}"
