"""The orchestrator: one call from an authenticated client to an audited result.

    client, tool, request
      -> tool lookup (policy: enabled tools of this client) -> schema check
      -> policy decision -> audit "decision"
      -> scheduler slot (deadline counted from admission; a raw file transfer: a slot of its
         client's own transfer pool, never an execution slot) -> backend.run
      -> audit "result" -> Result

Nothing here knows about HTTP: failures are typed exceptions that the API maps to problem+json.
A call whose decision or result cannot be audited fails (no unaudited execution).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sandboxd.access.approvals import ApprovalBook
from sandboxd.audit import AuditLog
from sandboxd.backends.base import Backend, CancelledAfterCleanup
from sandboxd.backends.factory import build_backends
from sandboxd.capacity import Capacity
from sandboxd.config import Settings
from sandboxd.errors import (
    AuditFailure,
    DrainCancelled,
    Draining,
    ExecutionFailure,
    HostFull,
    KernelLimitReached,
    ServiceError,
    ToolUnavailable,
    UnknownTool,
)
from sandboxd.health.metrics import Metrics
from sandboxd.health.readiness import BackendProbes
from sandboxd.health.state import HealthOps
from sandboxd.host.uids import UidPool
from sandboxd.models import (
    Cleanup,
    Decision,
    Explanation,
    Invocation,
    InvokeRequest,
    LimitsRequest,
    Reason,
    Result,
    Status,
    ToolSpec,
    new_id,
)
from sandboxd.policy import PolicyStore
from sandboxd.policy.packages import where_refusal
from sandboxd.protocol.display import DisplayCaps
from sandboxd.protocol.plan import ExecutionPlan, ToolKind
from sandboxd.receipts.sign import Receipts
from sandboxd.results.recorder import AuditRecorder, interrupted_calls
from sandboxd.results.streaming import EventSink
from sandboxd.scheduler import ClientPools, DeadlineExpired, Overloaded, Scheduler
from sandboxd.sessions.kernels import KernelCap, KernelTicket, SessionOps, note_kernel_lost
from sandboxd.sessions.manager import Session, SessionEnded, SessionManager
from sandboxd.sessions.restarts import SessionRestarts
from sandboxd.tools import validate_arguments
from sandboxd.util.deadline import stop_task, within
from sandboxd.util.stopclock import StopClock
from sandboxd.workspaces.quota import Usage, full_note
from sandboxd.workspaces.transfer import Transfer

log = logging.getLogger("sandboxd")
#: the message of a call its session's end cancelled (delete, expiry, revocation)
SESSION_ENDED = "the session ended (deleted, expired or its client revoked) during the call"


@dataclass(frozen=True)
class _Call:
    """One admitted call on its way to its backend, with the plan the service passes on."""

    id: str
    client: str
    tool: str
    request: InvokeRequest
    session: Session | None
    decision: Decision
    plan: ExecutionPlan
    backend: Backend
    transfer: Transfer | None
    events: EventSink | None


class Sandboxd(HealthOps, SessionOps, SessionRestarts):
    """Everything one daemon holds: policy, audit, scheduler, sessions, backends, metrics.
    The session operations (and kernels) are in :class:`~sandboxd.sessions.kernels.SessionOps`."""

    def __init__(self, settings: Settings, *, backends: dict[str, Backend] | None = None) -> None:
        self.settings = settings
        # nothing here touches the disk: the state directory and the audit log (and its lock)
        # are opened by start()
        self.audit: AuditLog
        self.recorder: AuditRecorder
        self.policy = PolicyStore(settings.policies_dir, on_event=self._policy_event)
        self.scheduler = Scheduler(settings.max_concurrency, settings.queue_size,
                                   settings.queue_timeout_s, settings.queue_per_client)
        # raw file transfers wait on the network: slots of their own, per client, never the above
        self.transfers = ClientPools(settings.transfer_slots_per_client, settings.queue_size,
                                     settings.queue_timeout_s, settings.queue_per_client)
        # one pool of per-sandbox uids shared by the sessions and every backend
        self.uids = UidPool.from_settings(settings)
        self.sessions = SessionManager(
            settings.state_dir, ttl_s=settings.session_ttl_s,
            quota_bytes=settings.session_quota_bytes,
            max_per_client=settings.max_sessions_per_client, uids=self.uids,
            keep_free=settings.max_concurrency + 2 * settings.warm_pool_size,
            quota_entries=settings.session_quota_entries, quota_mode=settings.workspace_quota,
            node_id=settings.node_id,
        )
        self.backends = (backends if backends is not None
                         else build_backends(settings, self.uids))
        self.probes = BackendProbes(self.backends)
        self.kernel_cap = KernelCap(settings.max_kernels, self.backends)
        self.metrics = Metrics(lambda: self.scheduler.queued, lambda: self.scheduler.in_use,
                               lambda: self.transfers.in_use)
        # admission by memory headroom, and what /v1/capacity and /metrics report
        self.capacity = Capacity(settings, kernels=self.kernel_cap, sessions=self.sessions,
                                 uids=self.uids)
        self.kernel_cap.gate = self.capacity.admit_kernel
        self.capacity.register(self.metrics.registry)
        self.draining = False
        # (when, problems) of the last refused policy reload while it is the latest word
        self._policy_refused: tuple[str, list[str]] | None = None
        self._inflight: set[asyncio.Task[Any]] = set()
        self._endings: set[asyncio.Future[dict[str, Any]]] = set()
        self._drain_cancelled: set[asyncio.Task[Any]] = set()  # answered as DrainCancelled
        self.stop_clock = StopClock(settings.shutdown_timeout_s)  # a stop's bound
        self._tasks: list[asyncio.Task[Any]] = []
        self._opened = False
        self._started = False
        # called (in the event loop's thread) after every policy load that took effect: the
        # MCP front door announces changed tool lists with it
        self.policy_listeners: list[Callable[[], None]] = []
        # calls the policy gates on a person's yes, waiting (sandboxd.access.approvals)
        self.approvals = ApprovalBook(
            lambda **f: self.recorder.record(self.audit.write, **f),
            lambda client, result, transport: self._finish(client, result, time.monotonic(),
                                                           transport=transport))

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the state directory and the audit log, load policies, sweep leftovers of a
        crash, start backends and background loops."""
        self.settings.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        receipts = Receipts.open(self.settings.state_dir, self.settings.audit_path,
                                 self.settings.audit_head_interval_s)  # its key, made at first
        self.audit = AuditLog(self.settings.audit_path, max_bytes=self.settings.audit_max_bytes,
                              retention_files=self.settings.audit_retention_files,
                              retention_days=self.settings.audit_retention_days)
        self.recorder = AuditRecorder(self.audit, receipts)
        self._opened = True
        self.policy.load()
        interrupted = interrupted_calls(self.settings.audit_path)
        # in a thread: removing what a crash left may walk big trees
        swept = await asyncio.to_thread(self.sessions.sweep)
        self._expect_recovered()
        if interrupted:
            self.audit.write("interrupted", requests=interrupted,
                             detail="calls in flight when the previous daemon stopped")
        for name, backend in self.backends.items():
            try:
                await backend.start()
            except Exception as exc:
                log.error("backend %s failed to start: %s", name, exc)
        self.audit.write(
            "startup", pid=os.getpid(), instance=self.settings.instance_name,
            backends={n: self._availability(b) for n, b in self.backends.items()},
            sessions_recovered=swept["recovered"], sessions_expired=swept["expired"],
            workspaces_removed=len(swept["removed"]), workspaces_failed=swept["failed"],
            workspace_quota=self.sessions.fs.detail,
        )
        await self._start_recovery()  # kept containers are re-adopted while it serves
        self._tasks = [
            asyncio.create_task(self.policy.watch(), name="policy-watch"),
            asyncio.create_task(self.recorder.watch(), name="audit-watch"),
            asyncio.create_task(
                self.sessions.expire_loop(
                    self._expire_session, min(15.0, self.settings.session_ttl_s / 4)),
                name="session-expiry"),
        ]
        self._started = True

    async def close(self) -> None:
        """Stop background loops and backends; write the shutdown record."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            await stop_task(task)
        survive = self.settings.sessions_survive_restart
        await stop_task(self._recovery)  # a start's adoption still under way: it ends here
        if self._started:  # the next start reads daemon_restart, not daemon_crash
            with contextlib.suppress(Exception):
                self._note_stop()
        if survive and self._started:
            with contextlib.suppress(Exception):  # bounded: what is not kept by then is not
                await within(self._keep_sessions(), self.stop_clock.left())
        with contextlib.suppress(Exception):  # tmpfs workspaces outlive the daemon if kept
            await self.sessions.close(self._end_session, survive=survive and self._started)
        for backend in self.backends.values():
            with contextlib.suppress(Exception):
                await backend.close()
        if self._opened:  # the records still queued are written before the shutdown record
            await asyncio.to_thread(self.recorder.close)
        if self._started:
            with contextlib.suppress(Exception):
                self.audit.write("shutdown", pid=os.getpid())
        if self._opened:
            self.audit.close()

    def begin_drain(self) -> None:
        """From now on refuse new calls (503) and report not ready; in-flight calls go on."""
        self.draining = True

    async def drain(self, grace_s: float) -> None:
        """Refuse new calls; let in-flight calls finish for ``grace_s``, then cancel them
        (each answers :class:`DrainCancelled`) within the calls' half of the stop's bound."""
        self.begin_drain()
        pending = set(self._inflight)
        if pending:
            _done, still = await asyncio.wait(pending, timeout=grace_s)
            self.stop_clock.start()
            for task in still:
                self._drain_cancelled.add(task)
                task.cancel()
            if still:
                await asyncio.wait(still, timeout=self.stop_clock.calls_left())
        self.stop_clock.start()

    # ------------------------------------------------------------ tools

    def tools(self, client: str) -> list[ToolSpec]:
        """The client's tools, with availability from their backends."""
        specs = []
        for spec in self.policy.tools_for(client):
            ok, reason = self._availability(self.backends.get(spec.backend or ""), spec.backend)
            specs.append(spec.model_copy(update={"available": ok, "unavailable_reason": reason}))
        return specs

    def _availability(self, backend: Backend | None,
                      name: str | None = None) -> tuple[bool, str | None]:
        if backend is None:
            return False, f"backend '{name}' is not installed or disabled on this host"
        return backend.availability()

    def explain(self, client: str, tool: str, arguments: dict[str, Any],
                limits: LimitsRequest | None, *, unknown_tool_denied: bool = False
                ) -> Explanation:
        """The decision for a call and where its rule is written, without running anything.
        Needs only the policy: ``sandboxd policy explain`` calls it after :meth:`load_policy`.
        A tool the client does not have raises :class:`UnknownTool`, or with
        ``unknown_tool_denied`` gets the policy's denial (which says why)."""
        try:
            spec = self._spec(client, tool)
        except UnknownTool:
            if not unknown_tool_denied:
                raise
        else:
            validate_arguments(tool, spec.parameters, arguments)
        decision = self.policy.decide(client, tool, arguments, limits)
        return Explanation(client=client, decision=decision,
                           location=self.policy.locate(client, decision.rule))

    def load_policy(self) -> None:
        """Load the policies alone (what :meth:`start` does first), for offline questions
        such as :meth:`explain`; :class:`~sandboxd.policy.PolicyError` when invalid."""
        self.policy.load()

    def reload_policy(self) -> bool:
        """Re-read the policies (SIGHUP). A broken set is refused: the previous policy stays,
        readiness says so; returns whether the new set took effect."""
        return self.policy.reload()

    def audit_event(self, event: str, **fields: Any) -> None:
        """Write one audit record from a front door (start-up refusals, failed
        authentications). Raises when the log cannot be written."""
        self.audit.write(event, **fields)

    def session(self, client: str, session_id: str) -> Session:
        """The client's session (:class:`~sandboxd.sessions.manager.SessionNotFound` otherwise)."""
        return self.sessions.get(session_id, client)

    def _spec(self, client: str, tool: str) -> ToolSpec:
        specs = {s.name: s for s in self.policy.tools_for(client)}
        if tool not in specs:
            raise UnknownTool(tool, sorted(specs))
        return specs[tool]

    # ------------------------------------------------------------ invoke

    async def invoke(self, client: str, tool: str, request: InvokeRequest, *,
                     transport: str = "http", transfer: Transfer | None = None,
                     events: EventSink | None = None,
                     started: asyncio.Event | None = None) -> Result:
        """Run one call end to end (see the module docstring). ``transport`` names the front
        door the call came through (``http``, ``mcp``); it goes into the audit records.
        ``transfer``: a raw upload/download's bytes (:mod:`sandboxd.workspaces.transfer`). A
        streaming
        caller passes ``events`` (the backend's output as it comes:
        :mod:`sandboxd.results.streaming`)
        and ``started``, set once the call holds a slot and its backend runs (everything that
        can refuse it before it runs has passed). A call is in flight for :meth:`drain` from
        its admission on, before its first ``await``."""
        if self.draining:
            raise Draining.for_call(request.session, self.settings.sessions_survive_restart)
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        try:
            return await self._invoke(client, tool, request, transport, transfer, events,
                                      started)
        except asyncio.CancelledError:
            if task is None or task not in self._drain_cancelled:
                raise
            task.uncancel()  # cancelled by the drain before its backend ran: refused
            raise Draining("the daemon is shutting down and cancelled this call before it "
                           "ran; retry on another instance or later") from None
        finally:
            if task is not None:
                self._inflight.discard(task)
                self._drain_cancelled.discard(task)

    async def _invoke(self, client: str, tool: str, request: InvokeRequest, transport: str,
                      transfer: Transfer | None, events: EventSink | None,
                      started: asyncio.Event | None) -> Result:
        admitted = time.monotonic()
        try:
            spec = self._spec(client, tool)
        except UnknownTool:
            await self.recorder.record(self.audit.write, event="unknown_tool", client=client,
                                       tool=tool, transport=transport)
            raise
        if transfer is None:
            validate_arguments(tool, spec.parameters, request.arguments)
        session = (self.sessions.get(request.session, client)
                   if request.session is not None else None)
        with self.sessions.in_use(session):  # it does not expire while the call runs
            if session is not None and self._recovery is not None and not self._recovery.done():
                await self.recovered(session)  # its kept kernel may be being re-adopted
                session = self.sessions.get(session.id, client)  # (ended if it failed)
            self._check_state_dir()
            invocation_id = new_id("inv")
            decision = self.policy.decide(client, tool, request.arguments, request.limits)
            decision = where_refusal(tool, decision, request.session, self.settings.wheelhouse)
            await self.recorder.record(self.audit.decision, request_id=invocation_id,
                                       client=client, tool=tool, session=request.session,
                                       arguments=request.arguments, decision=decision,
                                       transport=transport,
                                       # durable with the result: the client gets nothing before
                                       commit_with_result=events is None)
            # a gated call waits for a person's yes here, holding no slot (its clock then starts)
            decision, admitted = await self.approvals.gate(
                invocation_id, client, tool, request.session, request.arguments, decision,
                transport, admitted)
            if not decision.allowed:
                result = Result.denied(invocation_id, tool, decision, request.session)
                return await self._finish(client, result, admitted, transport=transport)
            backend = self.backends.get(decision.backend or "")
            ok, why = self._availability(backend, decision.backend)
            if not ok or backend is None:
                result = self._outcome(invocation_id, tool, decision, request.session, Status.error,
                                       Reason.policy, f"tool '{tool}' is unavailable: {why}")
                await self._finish(client, result, admitted, transport=transport)
                raise ToolUnavailable(f"tool '{tool}' is unavailable here: {why}")
            assert decision.plan is not None  # an allowed decision carries what runs
            # the policy's plan, plus what the service owns: display caps, advisory quota room
            plan = replace(decision.plan, display=DisplayCaps(self.settings.max_display_bytes,
                                                              self.settings.max_displays))
            if session is not None and plan.kind in (ToolKind.python, ToolKind.command):
                used = await self.sessions.check_quota(session)
                if not self.sessions.fs.kernel:
                    # advisory quota: no single file may take more than what is left of it
                    left = max(used.quota_bytes - used.bytes, 0)
                    plan = replace(plan, max_file_bytes=min(plan.max_file_bytes, left))
            deadline = admitted + plan.limits.timeout_s
            started = started or asyncio.Event()  # set once the call holds a slot and runs
            call = _Call(invocation_id, client, tool, request, session, decision, plan, backend,
                         transfer, events)
            restart_lost = self.restart_lost(session, decision.backend)  # ended by a restart?
            ticket: KernelTicket | None = None
            task = asyncio.current_task()
            try:
                # a session python call may start a kernel: within max_kernels only
                ticket = self.kernel_cap.admit(request.session, decision.backend,
                                               python=plan.kind is ToolKind.python)
                with self.sessions.cancellable(session):  # the session's end cancels it
                    result = await self._execute(call, deadline, started)
            except SessionEnded as exc:  # it found its session ended: nothing ran
                result = self._outcome(invocation_id, tool, decision, request.session,
                                       Status.killed, Reason.cancelled, str(exc))
                result.cleanup = Cleanup(verified=True, detail="cancelled before it started")
                return await self._finish(client, result, admitted, transport=transport)
            except (KernelLimitReached, HostFull, Overloaded) as exc:
                self.metrics.rejections.labels(reason=type(exc).__name__).inc()
                result = self._outcome(invocation_id, tool, decision, request.session,
                                       Status.rejected, Reason.policy, str(exc))
                await self._finish(client, result, admitted, transport=transport)
                raise
            except asyncio.CancelledError as exc:
                # its wall time is the time it was in the daemon's hands until the cancel
                result = self._outcome(invocation_id, tool, decision, request.session,
                                       Status.killed, Reason.cancelled, None, started=admitted)
                mine = asyncio.current_task()
                drained = mine is not None and mine in self._drain_cancelled
                if isinstance(exc, CancelledAfterCleanup):
                    result.cleanup = exc.cleanup
                    if exc.kernel is not None:
                        result.kernel = exc.kernel
                        result = note_kernel_lost(result)
                elif not started.is_set():  # cancelled while queued: nothing was started
                    result.cleanup = Cleanup(verified=True, detail="cancelled before it started")
                # cancelled by its session's end (or refused by a backend that found the
                # session closed), not by its caller: the caller hears the cancelled result
                if task is not None:
                    for _ in range(self.sessions.calls.ended_call(task)):
                        task.uncancel()
                if session is not None and not self.sessions.live(session) and (
                        task is None or not task.cancelling()):
                    result.message = SESSION_ENDED
                    return await self._finish(client, result, admitted, ran=True,
                                              transport=transport)
                with contextlib.suppress(ServiceError):
                    await self._finish(client, result, admitted, transport=transport)
                if drained and mine is not None:  # the drain's cancel: an answer, not a cut
                    mine.uncancel()
                    raise DrainCancelled(result, self.settings.drain_grace_s) from None
                raise
            except ToolUnavailable as exc:  # the backend found itself unavailable once admitted
                result = self._outcome(invocation_id, tool, decision, request.session,
                                       Status.error, Reason.policy, str(exc))
                await self._finish(client, result, admitted, transport=transport)
                raise
            except Exception as exc:
                log.exception("backend %s failed on %s", decision.backend, invocation_id)
                result = self._outcome(invocation_id, tool, decision, request.session,
                                       Status.error, Reason.exited, f"internal error: {exc}")
                await self._finish(client, result, admitted, ran=True, transport=transport)
                # the error's text stays in the log: it may carry host paths or OS messages
                raise ExecutionFailure(
                    f"the {decision.backend} backend failed unexpectedly on {invocation_id}; the "
                    "administrator can find the error in the daemon's log") from exc
            finally:
                if ticket is not None:
                    ticket.release()
                self.note_kernels(session)  # a crash must not hide the kernel it started
                self.sessions.calls.ended_call(task)  # a cancel swallowed on the way
            result = self.note_restart(session, decision.backend, restart_lost, result)
            if session is not None:
                self.sessions.touch(session)
            return await self._finish(client, result, admitted, ran=True, transport=transport)

    async def _execute(self, call: _Call, deadline: float, started: asyncio.Event) -> Result:
        """Run ``call`` in a slot, in its workspace (the session's, or a temporary one)."""
        limits, session = call.plan.limits, call.request.session
        try:
            # a raw transfer never takes an execution slot: its client's transfer slots
            slots = self.scheduler if call.transfer is None else self.transfers
            async with slots.slot(call.client, deadline):
                self.sessions.check_live(call.session)  # it may have ended while we waited
                started.set()
                if call.plan.kind is ToolKind.python:  # a crash during this call loses it
                    self.note_kernel_starting(call.session, call.decision.backend)
                async with self.sessions.workspace(call.session, call.id) as workspace:
                    invocation = Invocation(
                        id=call.id, tool=call.tool, client=call.client, session=session,
                        workspace=workspace, uid=self.sessions.identity(call.session, call.id),
                        arguments=call.request.arguments, plan=call.plan,
                        transfer=call.transfer, events=call.events)
                    result = note_kernel_lost(await call.backend.run(invocation, deadline))
                    result = await self._note_quota(result, call.plan, workspace)
        except DeadlineExpired as exc:
            return self._outcome(call.id, call.tool, call.decision, session, Status.timeout,
                                 Reason.wall_timeout, str(exc))
        return result.model_copy(update={"policy": call.decision.ref,
                                         "limits": result.limits or limits,
                                         "approval": call.decision.approval})

    async def _note_quota(self, result: Result, plan: ExecutionPlan, workspace: Path) -> Result:
        """Tell the model when its workspace is full
        (:func:`~sandboxd.workspaces.quota.full_note`)."""
        if plan.kind not in (ToolKind.python, ToolKind.command):
            return result  # the file tools say it themselves
        usage: Usage | None = None
        with contextlib.suppress(OSError):
            usage = await self.sessions.usage(workspace)
        note = full_note(usage, result.stderr[-8192:] + result.stdout[-4096:],
                         Usage(0, 0, self.settings.session_quota_bytes,
                               self.settings.session_quota_entries))
        if note is None:
            return result
        message = note if not result.message else f"{note} ({result.message})"
        return result.model_copy(update={"message": message})

    def _outcome(self, invocation_id: str, tool: str, decision: Decision, session: str | None,
                 status: Status, reason: Reason, message: str | None, *,
                 started: float | None = None) -> Result:
        """A result the service makes itself; ``started`` (monotonic): its wall time runs
        from then (none: nothing ran)."""
        return Result.build(
            (invocation_id, tool, session), decision.backend, reason, status=status,
            limits=decision.limits, policy=decision.ref,
            cleanup=Cleanup(verified=status is not Status.killed), message=message,
            started=started,
        )

    async def _finish(self, client: str, result: Result, admitted: float, *,
                      ran: bool = False, transport: str = "http") -> Result:
        """Audit the result and count it. ``ran``: the call executed, so an audit failure
        must not be reported as a refusal: the result is kept, written late, and returned
        inside the :class:`AuditFailure`."""
        result.node = self.settings.node_id  # which node ran it (a fleet routes by it)
        self.metrics.invocations.labels(tool=result.tool, status=result.status.value).inc()
        self.metrics.duration.labels(tool=result.tool).observe(time.monotonic() - admitted)
        try:
            await self.recorder.result(client, result, admitted, transport)  # + its receipt
        except AuditFailure as exc:
            if not ran:
                raise
            raise self.recorder.keep(client, result, transport, exc) from exc
        return result
