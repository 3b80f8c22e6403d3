"""A scripted, in-process backend for fast API and service tests: what httpx's
``MockTransport`` is to its transports. It runs nothing (no process, container, root or
Docker): each call is answered by a *script*, a function of the invocation and the effective
limits that returns a :class:`~sandboxd.models.Result` (or raises, or sleeps first).

It keeps the backend contract the service relies on, so service behaviour can be tested on it:
the deadline is enforced with the one deadline idiom (a script that outlives it ends as
``wall_timeout``), a cancelled call raises :class:`CancelledAfterCleanup` with verified
cleanup, and it counts the calls running at once (``peak``). It is never built from the
daemon's settings: tests pass it to :class:`~sandboxd.service.Sandboxd` explicitly. The real
backends' own suites stay what proves confinement.

Kernels are emulated as the real backends keep them (so that service tests
need no real sandbox): a session ``python`` call
runs in the session's kernel (``kernels``: session id -> calls so far), started fresh when
there is none; a call that ends on anything but a normal exit (timeout, limit, cancellation)
or whose script reports ``kernel.lost`` ends it. Every session python result carries its
``kernel`` object.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sandboxd.backends.base import Backend, CancelledAfterCleanup
from sandboxd.backends.capabilities import KernelHost
from sandboxd.models import (
    Cleanup,
    Invocation,
    Kernel,
    Limits,
    ProbeReport,
    Reason,
    Result,
    ToolKind,
)
from sandboxd.util.deadline import within

Script = Callable[[Invocation, Limits], "Result | Awaitable[Result]"]

NOTHING_TO_CLEAN = Cleanup(verified=True, detail="scripted backend: nothing was started")


def prints(text: str) -> Script:
    """A script whose every call exits 0 having printed ``text``."""

    def script(call: Invocation, limits: Limits) -> Result:
        return Result.build(call, None, Reason.exited, exit_code=0, stdout=text, limits=limits,
                            cleanup=NOTHING_TO_CLEAN)

    return script


def sleeps(seconds: float, then: Script | None = None) -> Script:
    """A script that takes ``seconds`` (asleep), then answers like ``then`` (default: prints
    nothing)."""
    after = then or prints("")

    async def script(call: Invocation, limits: Limits) -> Result:
        await asyncio.sleep(seconds)
        result = after(call, limits)
        return await result if inspect.isawaitable(result) else result

    return script


def fails(reason: Reason, **fields: Any) -> Script:
    """A script whose every call ends with ``reason`` (e.g. ``memory_limit``)."""

    def script(call: Invocation, limits: Limits) -> Result:
        return Result.build(call, None, reason, limits=limits, cleanup=NOTHING_TO_CLEAN,
                            **fields)

    return script


class ScriptedBackend(Backend, KernelHost):
    """A :class:`~sandboxd.backends.base.Backend` whose calls are answered by ``script``; it
    emulates kernels (:class:`~sandboxd.backends.capabilities.KernelHost`) and nothing else."""

    def __init__(self, name: str = "restricted", script: Script | None = None, *,
                 available: bool = True, probe_ok: bool = True) -> None:
        self.name = name
        self.script = script or prints("")
        self.available = available
        self.probe_ok = probe_ok
        self.calls: list[Invocation] = []
        self.closed_sessions: list[str] = []
        self.running = 0
        self.peak = 0
        self.started = False
        self.kernels: dict[str, int] = {}  # session id -> calls run in its live kernel
        self.restarts: list[str] = []

    async def start(self) -> None:
        """Nothing to prepare."""
        self.started = True

    async def close(self) -> None:
        """Nothing to stop."""
        self.started = False

    def availability(self) -> tuple[bool, str | None]:
        """As configured (``available``)."""
        return (True, None) if self.available else (False, "scripted backend: unavailable")

    async def run(self, invocation: Invocation, deadline: float) -> Result:
        """Answer with the script, within the deadline (in the session's kernel, if any)."""
        limits = invocation.plan.limits
        self.calls.append(invocation)
        self.running += 1
        self.peak = max(self.peak, self.running)
        started = time.monotonic()
        kernel = self._enter_kernel(invocation)
        try:
            finished, result = await within(self._answer(invocation, limits),
                                            deadline - time.monotonic())
        except asyncio.CancelledError:
            self._end_kernel(invocation)
            raise CancelledAfterCleanup(True, NOTHING_TO_CLEAN.detail) from None
        finally:
            self.running -= 1
        if not finished:
            result = Result.build(invocation, self.name, Reason.wall_timeout, limits=limits,
                                  started=started, cleanup=NOTHING_TO_CLEAN)
        if kernel is not None:
            lost = (result.termination.reason is not Reason.exited
                    or (result.kernel is not None and result.kernel.lost))
            if lost:
                self._end_kernel(invocation)
                reason = (result.kernel.reason if result.kernel and result.kernel.reason
                          else result.termination.reason.value)
                kernel = kernel.model_copy(update={"lost": True, "reason": reason})
            result = result.model_copy(update={"kernel": kernel})
        return result.model_copy(update={"backend": self.name})

    def _enter_kernel(self, invocation: Invocation) -> Kernel | None:
        """The session's kernel for this call (started when there is none), or None."""
        sid = invocation.session
        if sid is None or invocation.plan.kind is not ToolKind.python:
            return None
        fresh = sid not in self.kernels
        self.kernels[sid] = self.kernels.get(sid, 0) + 1
        return Kernel(fresh=fresh, calls=self.kernels[sid])

    def _end_kernel(self, invocation: Invocation) -> None:
        if invocation.session is not None and invocation.plan.kind is ToolKind.python:
            self.kernels.pop(invocation.session, None)

    async def _answer(self, invocation: Invocation, limits: Limits) -> Result:
        result = self.script(invocation, limits)
        return await result if inspect.isawaitable(result) else result

    async def close_session(self, session_id: str) -> None:
        """Record that the session ended."""
        self.closed_sessions.append(session_id)
        self.kernels.pop(session_id, None)

    def kernel_sessions(self) -> set[str]:
        """Sessions with a live (emulated) kernel."""
        return set(self.kernels)

    def interrupt_kernel(self, session_id: str) -> bool:
        """No emulated call can be interrupted."""
        return False

    async def restart_kernel(self, session_id: str) -> bool:
        """End the session's emulated kernel; whether there was one."""
        self.restarts.append(session_id)
        return self.kernels.pop(session_id, None) is not None

    async def probe(self) -> ProbeReport:
        """As configured (``probe_ok``)."""
        return ProbeReport(backend=self.name, ok=self.probe_ok,
                           detail="scripted backend (tests only)")
