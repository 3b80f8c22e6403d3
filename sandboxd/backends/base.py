"""The backend interface: one small protocol, several implementations (like httpx transports).

A backend executes an :class:`~sandboxd.models.Invocation` that the policy engine has already
allowed, under the effective limits of its plan (``invocation.plan.limits``), and must finish
by ``deadline``
(a ``time.monotonic()`` value). Whatever happens - success, crash, timeout, memory limit, or
cancellation of the awaiting task - it returns (or, on cancellation, raises after cleaning up)
only once every process / container it started is gone, and reports that in
``Result.cleanup.verified``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sandboxd.errors import SandboxdError
from sandboxd.models import Cleanup, Invocation, Kernel, ProbeReport, Result


class BackendUnavailable(SandboxdError, RuntimeError):
    """The backend cannot run anything on this host (e.g. no Docker engine, missing image)."""

    code = "backend-unavailable"


class CancelledAfterCleanup(asyncio.CancelledError):
    """Raised by :meth:`Backend.run` instead of a bare re-raise when its call was cancelled:
    the cleanup is done, and ``cleanup`` says whether it was verified, so that the audit
    record of a cancelled call carries the proof like any other result."""

    def __init__(self, verified: bool, detail: str | None = None,
                 kernel: Kernel | None = None) -> None:
        super().__init__(detail or "cancelled")
        self.cleanup = Cleanup(verified=verified, detail=detail)
        #: a session call's kernel as the cancel left it (kept when it was interrupted)
        self.kernel = kernel


@dataclass(frozen=True)
class KernelState:
    """A session kernel's state as its own sandbox pickled it for the session's forks: bytes
    the daemon relays and never unpickles (``None``: nothing is carried, ``reason`` says
    why), and the names left out with why."""

    blob: bytes | None
    not_carried: dict[str, str]
    reason: str | None = None


@runtime_checkable
class Backend(Protocol):
    """What the daemon needs from every execution backend: the core, which the backends
    subclass. What only some backends can do (kernels, forks' state, pausing, building
    images, healing, keeping sessions over a restart) is an optional capability of
    :mod:`.capabilities`, declared beside it; which backends exist is :mod:`.registry`'s."""

    #: short name used in policies and results (its registry entry's name)
    name: str

    async def start(self) -> None:
        """Prepare (zygote, warm pool, start-up sweep of leftovers). Called once at start-up."""

    async def close(self) -> None:
        """Stop everything this backend started. Called once at shutdown."""

    def availability(self) -> tuple[bool, str | None]:
        """``(True, None)`` when the backend can run calls now, else ``(False, reason)``."""

    async def run(self, invocation: Invocation, deadline: float) -> Result:
        """Execute one call, under the limits of its plan (``invocation.plan.limits``: the
        one definition of a call's limits, passed on as the policy decided them). On
        ``asyncio.CancelledError`` clean up fully, then raise
        :class:`CancelledAfterCleanup` (or re-raise when there was nothing to clean up)."""

    async def close_session(self, session_id: str) -> None:
        """Release anything kept for a session (e.g. its container or kernel). Idempotent."""

    async def probe(self) -> ProbeReport:
        """Prove that confinement holds by running probes through the backend (readiness)."""


#: the language of the kernels whose name is their backend's alone (as before there were others)
PYTHON = "python"


def kernel_name(backend: str, language: str) -> str:
    """The name of a session's ``language`` kernel on ``backend``, as the session's file and
    its audit records list it: a python kernel is named by its backend (``container``), any
    other by its backend and language (``container:bash``)."""
    return backend if language == PYTHON else f"{backend}:{language}"


def kernel_fields(name: str) -> dict[str, str]:
    """A kernel's name (:func:`kernel_name`) as an audit record's fields: its ``backend``,
    and its ``language`` when that is not python."""
    backend, _, language = name.partition(":")
    return {"backend": backend, "language": language} if language else {"backend": backend}

