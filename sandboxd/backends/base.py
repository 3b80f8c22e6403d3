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
from collections.abc import Mapping
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
    """What the daemon needs from an execution backend. The backends subclass it, so they
    inherit its defaults (``healing``); which backends exist is :mod:`.registry`'s."""

    #: short name used in policies and results (its registry entry's name)
    name: str
    #: why the backend is rebuilding state of its own that vanished under the daemon (e.g. the
    #: container runner directory), or None. While it is set, the backend's unavailability
    #: makes the daemon unready even when the backend is optional
    healing: str | None = None

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
        """Release anything kept for a session (e.g. its container). Idempotent."""

    async def restart_kernel(self, session_id: str) -> bool:
        """End the session's persistent Python kernel, if it has one (the next session
        ``python`` call starts a fresh one; the workspace is kept). ``True`` when a kernel was
        ended. Idempotent. Backends without kernels return ``False``."""

    def interrupt_kernel(self, session_id: str) -> bool:
        """Interrupt the ``python`` call that runs in the session's kernel now, if any: its
        code gets a ``KeyboardInterrupt``; the call ends ``killed`` (``cancelled``) and the
        kernel is kept when it comes back within ``kernel_interrupt_grace_s``
        (a runaway call need not cost the session its state).
        ``True`` when a call was running. Backends without kernels return ``False``."""

    def kernel_sessions(self) -> set[str]:
        """Ids of the sessions that have a live kernel on this backend now (the service caps
        their number host-wide: ``max_kernels``)."""

    async def snapshot_kernel(self, session_id: str, limit: int,
                              deadline: float) -> KernelState | None:
        """The session's live kernel's state, pickled inside its sandbox (at most ``limit``
        bytes), for its forks; ``None`` when this backend carries none (no live kernel, or
        kernels it cannot carry). Backends without kernels inherit this."""
        return None

    def seed_kernel(self, session_id: str, state: bytes) -> None:
        """Give a fork's session the state its first call's fresh kernel restores (inside
        its own sandbox) before it runs. Backends that carry no state inherit this."""

    def session_kernels(self) -> set[tuple[str, str]]:
        """``(session id, language)`` of each live kernel on this backend now (a session may
        have one per language: its python and its bash state are lost or kept each on its
        own). Backends whose kernels are all Python inherit this."""
        return {(sid, PYTHON) for sid in self.kernel_sessions()}

    def paused_sessions(self) -> set[str]:
        """Ids of the sessions whose sandbox this backend has paused now, idle (holding no CPU):
        ``GET /v1/sessions/{id}`` says ``paused``. Backends that never pause inherit this."""
        return set()

    async def pause_session(self, session_id: str) -> bool:
        """Pause the session's sandbox now, as idle pausing does (a client's own pause):
        ``True`` when it is paused after this. Backends that keep nothing running between
        calls (no container) inherit this: nothing to pause."""
        return False

    async def resume_session(self, session_id: str) -> bool:
        """Thaw the session's paused sandbox now (as its next call would): ``True`` when one
        was thawed. Backends that never pause inherit this."""
        return False

    def building(self) -> dict[str, dict[str, object]]:
        """What the backend is building for its tools (images, by name; ``/readyz``): a
        build's ``state`` and progress. Backends that build nothing inherit this."""
        return {}

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


def kernel_names(backends: Mapping[str, Backend], session_id: str) -> list[str]:
    """Names (:func:`kernel_name`) of the session's live kernels on the ``backends``."""
    return sorted(kernel_name(name, language) for name, backend in backends.items()
                  for sid, language in backend.session_kernels() if sid == session_id)


def kernel_backends(backends: Mapping[str, Backend], session_id: str) -> list[str]:
    """Names of the ``backends`` on which the session has a live kernel now."""
    return sorted(name for name, backend in backends.items()
                  if session_id in backend.kernel_sessions())
