"""The one root of the daemon's errors: :class:`SandboxdError`, with a ``code`` per error.

Every error the daemon raises on purpose derives from it (service, scheduler, sessions,
registry validation, policy loading, audit, configuration, tokens, storage, backends). The
HTTP layer (:mod:`sandboxd.api.problems`) is a table from ``code`` to status, problem type
and title; an error whose code is not in that table is a 500 without internals. The client
side mirrors this (:mod:`sandboxd_client.errors`: one root, a status table).

Not here, on purpose: the two standalone modules the container runner shares
(:mod:`sandboxd.protocol.wire`'s ``ProtocolError``, :mod:`sandboxd.protocol.rules`'
``PathRefused``: they may
import nothing of sandboxd), and what user code sees inside a sandbox.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol


class CallResult(Protocol):
    """What an error carries of a call that ran: its result (a ``sandboxd.models.Result``),
    sent in the problem body in its wire form. A protocol, so that this bottom floor names no
    floor above it."""

    def wire(self) -> dict[str, Any]: ...


class SandboxdError(Exception):
    """Base of every sandboxd error. ``code``: a stable identifier (the problem table's key)."""

    code: ClassVar[str] = "internal"

    def problem_fields(self) -> dict[str, Any]:
        """Members the problem+json body carries besides type, title, status and detail."""
        return {}

    def problem_headers(self) -> dict[str, str]:
        """HTTP headers of the response (``Retry-After``)."""
        return {}


# ---------------------------------------------------------------- the service's errors


class ServiceError(SandboxdError):
    """Base of the service's errors (the API turns each into problem+json by its code)."""

    code = "service-error"


class UnknownTool(ServiceError):
    code = "unknown-tool"

    def __init__(self, tool: str, available: list[str]) -> None:
        names = ", ".join(available) or "(none)"
        super().__init__(f"there is no tool '{tool}' for this client; available tools: {names}")
        self.tool = tool
        self.available = available

    def problem_fields(self) -> dict[str, Any]:
        return {"available_tools": self.available}


#: Retry-After of a 503 for a backend that is down (its watch reconnects within seconds)
UNAVAILABLE_RETRY_S = 5


class ToolUnavailable(ServiceError):
    """The tool's backend cannot run calls on this host right now."""

    code = "tool-unavailable"

    def problem_fields(self) -> dict[str, Any]:
        return {"retry_after": UNAVAILABLE_RETRY_S}

    def problem_headers(self) -> dict[str, str]:
        return {"Retry-After": str(UNAVAILABLE_RETRY_S)}


class Draining(ServiceError):
    """The daemon is shutting down and takes no new calls."""

    code = "draining"

    def problem_headers(self) -> dict[str, str]:
        return {"Retry-After": "5"}

    @classmethod
    def for_call(cls, session: str | None, sessions_survive: bool) -> Draining:
        """The refusal of a call that arrives during the drain. A one-shot call may run on
        any instance; a session's call only where its session lives, this node, so it is
        never told to go elsewhere: its session is kept for this node's next start
        (``sessions_survive_restart``), or ends with this stop."""
        if session is None:
            return cls("the daemon is shutting down; retry on another instance or later")
        if sessions_survive:
            return cls("the daemon is shutting down; the call's session lives on this node "
                       "and is kept for its next start: retry the call here once the daemon "
                       "is back")
        return cls("the daemon is shutting down and the call's session ends with it "
                   "(sessions_survive_restart is off): create a new session once a daemon "
                   "is back, or on another instance")


class DrainCancelled(Draining):
    """A call the drain cancelled at the end of its grace (``drain_grace_s``): its processes
    were stopped; ``result`` is what the audit log has of it (``killed``, ``cancelled``)."""

    def __init__(self, result: CallResult, grace_s: float) -> None:
        super().__init__(f"the daemon is shutting down and cancelled this call at the end of its "
                         f"drain grace ({grace_s:g} s): it was stopped; retry on another "
                         "instance or later")
        self.result = result

    def problem_fields(self) -> dict[str, Any]:
        return {"ran": True, "result": self.result.wire()}


class AuditFailure(ServiceError):
    """The audit log could not be written. Before anything ran the call is refused; after it
    ran, ``result`` is the call's result (recorded as soon as the log is writable again).
    ``storage``: the cause is a full filesystem (507) rather than another failure (500)."""

    code = "audit-failure"

    def __init__(self, message: str, *, storage: bool,
                 result: CallResult | None = None) -> None:
        super().__init__(message)
        self.storage = storage
        self.result = result
        if storage:
            self.code = "audit-storage-full"  # type: ignore[misc]  # 507 rather than 500

    def problem_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"ran": self.result is not None}
        if self.result is not None:
            fields["result"] = self.result.wire()
        return fields


class StorageUnavailable(ServiceError):
    """The state directory is full: refused before anything runs (507)."""

    code = "storage-full"


class ExecutionFailure(ServiceError):
    """A backend failed unexpectedly (a bug, not a sandbox outcome)."""

    code = "execution-failure"


#: Retry-After of a refusal because the host is full (a cap, its memory, its sandbox uids):
#: room comes back when sessions end or kernels go idle, never predictably sooner
HOST_FULL_RETRY_S = 10


class KernelLimitReached(ServiceError):
    """A session ``python`` call would start a kernel beyond the host's ``max_kernels``:
    refused (429, ``Retry-After``) before anything runs."""

    code = "too-many-kernels"

    def problem_fields(self) -> dict[str, Any]:
        return {"full": "max_kernels", "retry_after": HOST_FULL_RETRY_S}

    def problem_headers(self) -> dict[str, str]:
        return {"Retry-After": str(HOST_FULL_RETRY_S)}


class HostFull(ServiceError):
    """The host has no room for a new session or kernel (503, ``Retry-After``): ``full``
    names what is full (``memory``: the measured headroom is below the reserve;
    ``sandbox_uids``: every sandbox identity is in use). Nothing ran; what was admitted
    before goes on working."""

    code = "host-full"

    def __init__(self, message: str, full: str) -> None:
        super().__init__(message)
        self.full = full

    def problem_fields(self) -> dict[str, Any]:
        return {"full": self.full, "retry_after": HOST_FULL_RETRY_S}

    def problem_headers(self) -> dict[str, str]:
        return {"Retry-After": str(HOST_FULL_RETRY_S)}


