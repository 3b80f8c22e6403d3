"""One call on a restricted worker as the backend's functions take it: the backend's per-call
object (:class:`sandboxd.backends.call.BackendCall`) with the request its worker gets, and
what the daemon saw of the call (:class:`Exchange`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sandboxd.backends.call import BackendCall
from sandboxd.backends.restricted.frames import FrameReader
from sandboxd.models import Invocation, Limits, Reason
from sandboxd.protocol.call import WorkerRequest


@dataclass(frozen=True)
class WorkerCall:
    """A call and the request its worker gets. Its limits are the request's: the plan's, or
    for a session kernel's later calls the kernel's (its first call's memory, CPU share and
    pids)."""

    call: BackendCall
    request: WorkerRequest

    @property
    def invocation(self) -> Invocation:
        """The call's invocation."""
        return self.call.invocation

    @property
    def limits(self) -> Limits:
        """The limits the worker runs under (the request's)."""
        return self.request.limits

    @property
    def deadline(self) -> float:
        """When the call must have ended (``time.monotonic()``)."""
        return self.call.deadline

    @property
    def started(self) -> float:
        """When the call began (its wall time runs from then)."""
        return self.call.started


@dataclass
class Exchange:
    """What the daemon saw of one call on a worker."""

    reader: FrameReader
    #: a limit the daemon enforced (deadline, output), None otherwise
    reason: Reason | None
    #: why the call failed on the daemon's side (protocol violation, zygote gone), if it did
    crashed: str | None
    #: the worker's exit report (zygote's or the daemon's own), None when there is none
    exit_info: dict[str, Any] | None
