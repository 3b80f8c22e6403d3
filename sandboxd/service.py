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
from collections.abc import Sequence
from typing import Any

from sandboxd.access.approvals import ApprovalBook
from sandboxd.audit import AuditLog
from sandboxd.backends.base import Backend
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
from sandboxd.health.readiness import BackendProbes, Readiness
from sandboxd.health.state import Health
from sandboxd.host.uids import UidPool
from sandboxd.invoke.drain import Drain
from sandboxd.invoke.egress import wire_egress
from sandboxd.invoke.execute import AdmittedCall, Execution, own_result
from sandboxd.invoke.steps import finish, result_steps
from sandboxd.invoke.stopped import SESSION_ENDED, cancelled, not_started, stopped
from sandboxd.models import (
    Explanation,
    InvokeRequest,
    LimitsRequest,
    Reason,
    Result,
    Status,
    ToolSpec,
    new_id,
)
from sandboxd.policy import PolicyStore
from sandboxd.policy.site import CallSite
from sandboxd.protocol.plan import KERNEL_KINDS
from sandboxd.receipts.recorder import AuditRecorder, interrupted_calls
from sandboxd.receipts.sign import Receipts
from sandboxd.results.streaming import EventSink
from sandboxd.scheduler import ClientPools, Overloaded, Scheduler
from sandboxd.sessions.kernels import KernelCap, KernelTicket, SessionService
from sandboxd.sessions.manager import Session, SessionEnded, SessionManager
from sandboxd.sessions.ready import ready_sessions
from sandboxd.sessions.restarts import Restarts, kernel_of
from sandboxd.tools import validate_arguments
from sandboxd.util.deadline import stop_task, within
from sandboxd.util.stopclock import StopClock
from sandboxd.workspaces.transfer import Transfer

log = logging.getLogger("sandboxd")


class Sandboxd:
    """Everything one daemon holds: policy, audit, scheduler, sessions, backends, metrics.
    Its parts are built here with what each needs: :attr:`health`, :attr:`restarts`, the
    session operations (:attr:`session_ops`, the public ones delegated below), the
    execution of admitted calls (:attr:`execution`) and the calls in flight (:attr:`drains`)."""

    def __init__(self, settings: Settings, *, backends: dict[str, Backend] | None = None) -> None:
        self.settings = settings
        # nothing here touches the disk: the state directory and the audit log (and its lock)
        # are opened by start()
        self.audit: AuditLog
        self.recorder: AuditRecorder
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
        self.health = Health(settings, self.sessions, self.metrics, self.probes,
                             audit_problem=lambda: self.recorder.problem(),
                             write=self._write_if_open)
        self.policy = PolicyStore(settings.policies_dir, on_event=self.health.policy_event)
        self.restarts = Restarts(settings, self.sessions, self.backends, self._record)
        self.session_ops = SessionService(settings, self.sessions, self.backends, self.health,
                                          self._record, self.restarts.note_kernels)
        self.execution = Execution(settings, self.scheduler, self.transfers, self.sessions,
                                   self.restarts)
        # admission by memory headroom, and what /v1/capacity and /metrics report
        self.capacity = Capacity(settings, kernels=self.kernel_cap, sessions=self.sessions,
                                 uids=self.uids)
        self.kernel_cap.gate = self.capacity.admit_kernel
        self.session_ops.admit_session = self.capacity.admit_session
        self.session_ops.ready = ready = ready_sessions(self.sessions, self.backends, self.policy)
        self.capacity.ready = lambda: sum(len(r.queue) for r in ready)
        self.capacity.register(self.metrics.registry)
        self.stop_clock = StopClock(settings.shutdown_timeout_s)  # a stop's bound
        self.drains = Drain(self.health, self.stop_clock)  # the calls in flight at a stop
        self._tasks: list[asyncio.Task[Any]] = []
        self._opened = False
        self._started = False
        self.policy_listeners = self.health.policy_listeners  # (the MCP door's: tool lists)
        # calls the policy gates on a person's yes, waiting (sandboxd.access.approvals)
        self.approvals = ApprovalBook(
            self._record,
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
        self.restarts.expect_recovered()
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
        # kept containers are re-adopted while it serves
        await self.restarts.start_recovery(self.end_session)
        for ready in self.session_ops.ready:  # sessions made ahead, their sandbox started
            ready.start()
        wire_egress(self.backends.values(), self.policy, self.metrics, self._record,
                    self.policy_listeners)  # the egress proxy's records and reloads
        self._tasks = [
            asyncio.create_task(self.policy.watch(), name="policy-watch"),
            asyncio.create_task(self.recorder.watch(), name="audit-watch"),
            asyncio.create_task(
                self.sessions.expire_loop(
                    self.session_ops.expire_session, min(15.0, self.settings.session_ttl_s / 4)),
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
        await stop_task(self.restarts.recovery)  # a start's adoption still under way: it ends here
        if self._started:  # the next start reads daemon_restart, not daemon_crash
            with contextlib.suppress(Exception):
                self.restarts.note_stop()
        if survive and self._started:
            with contextlib.suppress(Exception):  # bounded: what is not kept by then is not
                await within(self.restarts.keep_sessions(), self.stop_clock.left())
        for ready in self.session_ops.ready:  # never kept: nobody's sessions yet (what is
            with contextlib.suppress(Exception):  # left by the bound goes with the backend)
                await within(ready.close(), self.stop_clock.left())
        with contextlib.suppress(Exception):  # tmpfs workspaces outlive the daemon if kept
            await self.sessions.close(self.session_ops.end_at_stop,
                                      survive=survive and self._started)
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
        self.drains.begin()

    @property
    def draining(self) -> bool:
        """Refusing new calls: the daemon is stopping (:meth:`begin_drain`)."""
        return self.health.draining

    async def drain(self, grace_s: float) -> None:
        """Refuse new calls; let in-flight calls finish for ``grace_s``, then cancel them
        (each answers :class:`DrainCancelled`) within the calls' half of the stop's bound."""
        await self.drains.drain(grace_s)

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
        Needs only the policy: ``sandboxd policy explain`` calls it after :meth:`load_policy`
        (:meth:`PolicyStore.explain <sandboxd.policy.store.PolicyStore.explain>`)."""
        return self.policy.explain(client, tool, arguments, limits,
                                   unknown_tool_denied=unknown_tool_denied)

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

    # ------------------------------------------------------------ sessions, readiness

    async def create_session(self, client: str, ttl_s: float | None, *,
                             transport: str = "http") -> Session:
        """:meth:`SessionService.create_session <sandboxd.sessions.kernels.SessionService>`."""
        return await self.session_ops.create_session(client, ttl_s, transport=transport)

    async def list_sessions(self, client: str) -> list[dict[str, Any]]:
        """The client's live sessions as the API shows them, oldest first."""
        return await self.session_ops.list_sessions(client)

    async def session_view(self, session: Session) -> dict[str, Any]:
        """The session as the API shows it: usage and kernel state included."""
        return await self.session_ops.session_view(session)

    async def restart_session(self, client: str, session_id: str, *,
                              transport: str = "http") -> dict[str, Any]:
        """End the session's kernels (its workspace stays); audited."""
        return await self.session_ops.restart_session(client, session_id, transport=transport)

    async def interrupt_session(self, client: str, session_id: str, *,
                                transport: str = "http") -> dict[str, Any]:
        """Interrupt the session's running python call (its kernel stays); audited."""
        return await self.session_ops.interrupt_session(client, session_id,
                                                        transport=transport)

    async def pause_session(self, client: str, session_id: str, *,
                            transport: str = "http") -> dict[str, Any]:
        """Pause the session's sandbox now, as idle pausing does; audited."""
        return await self.session_ops.pause_session(client, session_id, transport=transport)

    async def resume_session(self, client: str, session_id: str, *,
                             transport: str = "http") -> dict[str, Any]:
        """Thaw the session's paused sandbox; audited."""
        return await self.session_ops.resume_session(client, session_id, transport=transport)

    async def delete_session(self, client: str, session_id: str, *,
                             transport: str = "http") -> None:
        """Delete a session: its kernels, anything a backend kept, its workspace (audited)."""
        await self.session_ops.delete_session(client, session_id, transport=transport)

    async def end_session(self, session: Session, event: str | None,
                          **fields: Any) -> dict[str, Any] | None:
        """The one way a session ends (:meth:`SessionService.end_session
        <sandboxd.sessions.kernels.SessionService.end_session>`)."""
        return await self.session_ops.end_session(session, event, **fields)

    async def revoke_client(self, client: str, reason: str, *,
                            mcp_sessions: Sequence[str] = ()) -> dict[str, Any]:
        """End every session of a client that has no valid token left (audited)."""
        return await self.session_ops.revoke_client(client, reason, mcp_sessions=mcp_sessions)

    def kernel_backends(self, session_id: str) -> list[str]:
        """Names of the backends on which the session has a live kernel now."""
        return self.session_ops.kernel_backends(session_id)

    async def readiness(self, *, fresh: bool = False) -> Readiness:
        """Whether the daemon may take work, and why not (:class:`Health`)."""
        return await self.health.readiness(fresh=fresh)

    async def _record(self, **fields: Any) -> None:
        """One audit record through the recorder (its parts write theirs with it)."""
        await self.recorder.record(self.audit.write, **fields)

    def _write_if_open(self, event: str, **fields: Any) -> None:
        """One audit record now; an offline service (policy questions only) has no log."""
        if self._opened:
            self.audit.write(event, **fields)

    # ------------------------------------------------------------ invoke

    async def invoke(self, client: str, tool: str, request: InvokeRequest, *,
                     transport: str = "http", transfer: Transfer | None = None,
                     events: EventSink | None = None,
                     started: asyncio.Event | None = None) -> Result:
        """Run one call end to end (see the module docstring). ``transport`` names the front
        door the call came through (``http``, ``mcp``); it goes into the audit records.
        ``transfer``: a raw upload/download's bytes (:mod:`sandboxd.workspaces.transfer`). A
        streaming caller passes ``events`` (the backend's output as it comes:
        :mod:`sandboxd.results.streaming`) and ``started``, set once the call holds a slot and
        its backend runs (everything that can refuse it before it runs has passed). A call is
        in flight for :meth:`drain` from its admission on, before its first ``await``."""
        if self.draining:
            raise Draining.for_call(request.session, self.settings.sessions_survive_restart)
        with self.drains.tracked(asyncio.current_task()):
            return await self._invoke(client, tool, request, transport, transfer, events,
                                      started)

    async def _invoke(self, client: str, tool: str, request: InvokeRequest, transport: str,
                      transfer: Transfer | None, events: EventSink | None,
                      started: asyncio.Event | None) -> Result:
        admitted = time.monotonic()
        try:
            spec = self.policy.spec(client, tool)
        except UnknownTool:
            await self._record(event="unknown_tool", client=client, tool=tool,
                               transport=transport)
            raise
        if transfer is None:
            validate_arguments(tool, spec.parameters, request.arguments)
        session = (self.sessions.get(request.session, client)
                   if request.session is not None else None)
        with self.sessions.in_use(session):  # it does not expire while the call runs
            if session is not None and self.restarts.recovering:
                await self.restarts.recovered(session)  # its kept kernel may be being re-adopted
                session = self.sessions.get(session.id, client)  # (ended if it failed)
            self.health.check_state_dir()
            invocation_id = new_id("inv")
            decision = self.policy.decide(client, tool, request.arguments, request.limits,
                                          CallSite(request.session, self.settings.wheelhouse))
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
                result = own_result(invocation_id, tool, decision, request.session, Status.error,
                                   Reason.policy, f"tool '{tool}' is unavailable: {why}")
                await self._finish(client, result, admitted, transport=transport)
                raise ToolUnavailable(f"tool '{tool}' is unavailable here: {why}")
            plan = await self.execution.plan(decision, session)
            call = AdmittedCall(invocation_id, client, tool, request, session, decision, plan,
                                backend, transfer, events)
            return await self._run(call, admitted, transport, started or asyncio.Event())

    async def _run(self, call: AdmittedCall, admitted: float, transport: str,
                   started: asyncio.Event) -> Result:
        """An admitted call in its backend, within its deadline and the kernel cap, and the
        answer for each way it can end."""
        session, decision = call.session, call.decision
        deadline = admitted + call.plan.limits.timeout_s
        # the kernel a restart ended, said by the first call that reaches it
        kernel = kernel_of(decision.backend, call.plan.kind)
        restart_lost = self.restarts.restart_lost(session, kernel)
        ticket: KernelTicket | None = None
        task = asyncio.current_task()
        try:
            # a session python call may start a kernel: within max_kernels only
            ticket = self.kernel_cap.admit(call.request.session, kernel,
                                           python=call.plan.kind in KERNEL_KINDS)
            with self.sessions.cancellable(session):  # the session's end cancels it
                result, quota = await self.execution.run(call, deadline, started)
        except SessionEnded as exc:  # it found its session ended: nothing ran
            return await self._finish(call.client, not_started(call, str(exc)), admitted,
                                      transport=transport)
        except (KernelLimitReached, HostFull, Overloaded) as exc:
            self.metrics.rejections.labels(reason=type(exc).__name__).inc()
            result = stopped(call, Status.rejected, Reason.policy, str(exc))
            await self._finish(call.client, result, admitted, transport=transport)
            raise
        except asyncio.CancelledError as exc:
            return await self._cancelled(call, exc, admitted, transport, started.is_set())
        except ToolUnavailable as exc:  # the backend found itself unavailable once admitted
            result = stopped(call, Status.error, Reason.policy, str(exc))
            await self._finish(call.client, result, admitted, transport=transport)
            raise
        except Exception as exc:
            log.exception("backend %s failed on %s", decision.backend, call.id)
            result = stopped(call, Status.error, Reason.exited, f"internal error: {exc}")
            await self._finish(call.client, result, admitted, ran=True, transport=transport)
            # the error's text stays in the log: it may carry host paths or OS messages
            raise ExecutionFailure(
                f"the {decision.backend} backend failed unexpectedly on {call.id}; the "
                "administrator can find the error in the daemon's log") from exc
        finally:
            if ticket is not None:
                ticket.release()
            self.restarts.note_kernels(session)  # a crash must not hide the kernel it started
            self.sessions.calls.ended_call(task)  # a cancel swallowed on the way
        restart = self.restarts.forget_restart(session, kernel, restart_lost, result)
        result = finish(result, result_steps(quota=quota, restart=restart,
                                             language=call.plan.kind.value))
        if session is not None:
            self.sessions.touch(session)
        return await self._finish(call.client, result, admitted, ran=True, transport=transport)

    async def _cancelled(self, call: AdmittedCall, exc: asyncio.CancelledError,
                         admitted: float, transport: str, started: bool) -> Result:
        """A cancelled call's answer (:func:`sandboxd.invoke.stopped.cancelled`), audited. Cut
        by its session's end (or refused by a backend that found the session closed), not by
        its caller, the caller hears the cancelled result; a drain's cancel is an answer
        (:class:`DrainCancelled`); any other cancel goes on."""
        result = cancelled(call, exc, admitted, started)
        task = asyncio.current_task()
        drained = self.drains.cancelled(task)
        if task is not None:
            for _ in range(self.sessions.calls.ended_call(task)):
                task.uncancel()
        if call.session is not None and not self.sessions.live(call.session) and (
                task is None or not task.cancelling()):
            result.message = SESSION_ENDED
            return await self._finish(call.client, result, admitted, ran=True,
                                      transport=transport)
        with contextlib.suppress(ServiceError):
            await self._finish(call.client, result, admitted, transport=transport)
        if drained and task is not None:  # the drain's cancel: an answer, not a cut
            task.uncancel()
            raise DrainCancelled(result, self.settings.drain_grace_s) from None
        raise exc

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
