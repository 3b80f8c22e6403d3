"""The orchestrator: one call from an authenticated client to an audited result.

    client, tool, request
      -> tool lookup (policy: enabled tools of this client) -> schema check
      -> policy decision -> audit "decision"
      -> scheduler slot (deadline counted from admission) -> backend.run
      -> audit "result" -> Result

Nothing here knows about HTTP: failures are typed exceptions that the API maps to problem+json.
A call whose decision or result cannot be audited fails (no unaudited execution).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandboxd.audit import AuditLog
from sandboxd.backends.base import Backend, CancelledAfterCleanup
from sandboxd.config import Settings
from sandboxd.errors import SandboxdError
from sandboxd.metrics import Metrics
from sandboxd.models import (
    Cleanup,
    Decision,
    Invocation,
    InvokeRequest,
    Limits,
    LimitsRequest,
    ProbeReport,
    Reason,
    Result,
    Status,
    ToolKind,
    ToolSpec,
    new_id,
)
from sandboxd.policy import PolicyStore
from sandboxd.quotafs import Usage, quota_message
from sandboxd.registry import validate_arguments
from sandboxd.scheduler import DeadlineExpired, Overloaded, Scheduler
from sandboxd.sessions import Session, SessionManager
from sandboxd.storage import full_reason, is_no_space
from sandboxd.uids import UidPool

log = logging.getLogger("sandboxd")

READINESS_CACHE_S = 10.0
DEFAULT_BACKEND = "restricted"


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


class AuditFailure(ServiceError):
    """The audit log could not be written. Before anything ran the call is refused; after it
    ran, ``result`` is the call's result (recorded as soon as the log is writable again).
    ``storage``: the cause is a full filesystem (507) rather than another failure (500)."""

    code = "audit-failure"

    def __init__(self, message: str, *, storage: bool, result: Result | None = None) -> None:
        super().__init__(message)
        self.storage = storage
        self.result = result
        if storage:
            self.code = "audit-storage-full"  # type: ignore[misc]  # 507 rather than 500

    def problem_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"ran": self.result is not None}
        if self.result is not None:
            fields["result"] = self.result.model_dump(mode="json")
        return fields


class StorageUnavailable(ServiceError):
    """The state directory is full: refused before anything runs (507)."""

    code = "storage-full"


class ExecutionFailure(ServiceError):
    """A backend failed unexpectedly (a bug, not a sandbox outcome)."""

    code = "execution-failure"


def _build_backends(settings: Settings, uids: UidPool | None) -> dict[str, Backend]:
    from sandboxd.backends.workspace import WorkspaceBackend

    backends: dict[str, Backend] = {"workspace": WorkspaceBackend(settings)}
    if settings.restricted_enabled:
        try:
            from sandboxd.backends.restricted import RestrictedBackend
        except ImportError as exc:  # pragma: no cover - depends on the install
            log.error("restricted backend unavailable: %s", exc)
        else:
            backends["restricted"] = RestrictedBackend(settings, uids)
    if settings.container_enabled:
        try:
            from sandboxd.backends.container import ContainerBackend
        except ImportError as exc:  # pragma: no cover
            log.error("container backend unavailable: %s", exc)
        else:
            backends["container"] = ContainerBackend(settings, uids)
    return backends


class Sandboxd:
    """Everything one daemon holds: policy, audit, scheduler, sessions, backends, metrics."""

    def __init__(self, settings: Settings, *, backends: dict[str, Backend] | None = None) -> None:
        self.settings = settings
        settings.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.audit = AuditLog(settings.audit_path, max_bytes=settings.audit_max_bytes,
                              retention_files=settings.audit_retention_files,
                              retention_days=settings.audit_retention_days)
        self.policy = PolicyStore(settings.policies_dir, on_event=self._policy_event)
        self.scheduler = Scheduler(settings.max_concurrency, settings.queue_size,
                                   settings.queue_timeout_s, settings.queue_per_client)
        # one pool of per-sandbox uids shared by the sessions and every backend
        self.uids = UidPool.from_settings(settings)
        self.sessions = SessionManager(
            settings.state_dir, ttl_s=settings.session_ttl_s,
            quota_bytes=settings.session_quota_bytes,
            max_per_client=settings.max_sessions_per_client, uids=self.uids,
            keep_free=settings.max_concurrency + 2 * settings.warm_pool_size,
            quota_entries=settings.session_quota_entries, quota_mode=settings.workspace_quota,
        )
        self.backends = (backends if backends is not None
                         else _build_backends(settings, self.uids))
        self.metrics = Metrics(lambda: self.scheduler.queued, lambda: self.scheduler.in_use)
        self.draining = False
        # (when, problems) of the last refused policy reload while it is the latest word
        self._policy_refused: tuple[str, list[str]] | None = None
        self._inflight: set[asyncio.Task[Any]] = set()
        self._tasks: list[asyncio.Task[Any]] = []
        self._readiness: tuple[float, dict[str, Any]] | None = None
        self._started = False
        # results of calls that ran while the audit log could not be written: written (late)
        # as soon as it can be again; ``_audit_failed`` says why it cannot (None: it can)
        self._unrecorded: list[tuple[str, Result, str]] = []
        self._audit_failed: str | None = None
        # called (in the event loop's thread) after every policy load that took effect: the
        # MCP front door announces changed tool lists with it
        self.policy_listeners: list[Callable[[], None]] = []

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Load policies, sweep leftovers of a crash, start backends and background loops."""
        self.policy.load()
        interrupted = _interrupted_calls(self.settings.audit_path)
        # in a thread: removing what a crash left may walk big trees
        swept = await asyncio.to_thread(self.sessions.sweep)
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
        self._tasks = [
            asyncio.create_task(self.policy.watch(), name="policy-watch"),
            asyncio.create_task(self._audit_watch(), name="audit-watch"),
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
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):  # tmpfs workspaces must not outlive the daemon
            await self.sessions.close(self._end_session)
        for backend in self.backends.values():
            with contextlib.suppress(Exception):
                await backend.close()
        if self._started:
            with contextlib.suppress(Exception):
                self.audit.write("shutdown", pid=os.getpid())
        self.audit.close()

    async def drain(self, grace_s: float) -> None:
        """Refuse new calls; let in-flight calls finish for ``grace_s``, then cancel them."""
        self.draining = True
        pending = set(self._inflight)
        if pending:
            _done, still = await asyncio.wait(pending, timeout=grace_s)
            for task in still:
                task.cancel()
            if still:
                await asyncio.wait(still, timeout=30)

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
                limits: LimitsRequest | None) -> Decision:
        """The decision for a call, without running anything."""
        spec = self._spec(client, tool)
        validate_arguments(tool, spec.parameters, arguments)
        return self.policy.decide(client, tool, arguments, limits)

    def _spec(self, client: str, tool: str) -> ToolSpec:
        specs = {s.name: s for s in self.policy.tools_for(client)}
        if tool not in specs:
            raise UnknownTool(tool, sorted(specs))
        return specs[tool]

    # ------------------------------------------------------------ invoke

    async def invoke(self, client: str, tool: str, request: InvokeRequest, *,
                     transport: str = "http") -> Result:
        """Run one call end to end (see the module docstring). ``transport`` names the front
        door the call came through (``http``, ``mcp``); it goes into the audit records."""
        if self.draining:
            raise Draining("the daemon is shutting down; retry on another instance or later")
        admitted = time.monotonic()
        try:
            spec = self._spec(client, tool)
        except UnknownTool:
            await self._audit(self.audit.write, event="unknown_tool", client=client, tool=tool,
                              transport=transport)
            raise
        validate_arguments(tool, spec.parameters, request.arguments)
        session = (self.sessions.get(request.session, client)
                   if request.session is not None else None)
        self._check_state_dir()
        invocation_id = new_id("inv")
        decision = self.policy.decide(client, tool, request.arguments, request.limits)
        await self._audit(self.audit.decision, request_id=invocation_id, client=client, tool=tool,
                          session=request.session, arguments=request.arguments,
                          decision=decision, transport=transport)
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
        if session is not None and decision.kind in (ToolKind.python, ToolKind.command):
            used = await self.sessions.check_quota(session)
            if not self.sessions.fs.kernel:
                # advisory quota: no single file may take more than what is left of it
                left = max(used.quota_bytes - used.bytes, 0)
                decision = decision.model_copy(
                    update={"max_file_bytes": min(decision.max_file_bytes, left)})
        assert decision.limits is not None
        limits = decision.limits
        deadline = admitted + limits.timeout_s
        task = asyncio.current_task()
        if task is not None:
            self._inflight.add(task)
        started = asyncio.Event()  # set once the call holds a slot and its backend runs
        try:
            result = await self._execute(client, invocation_id, tool, decision, backend,
                                         session, request, limits, deadline, started)
        except Overloaded as exc:
            self.metrics.rejections.labels(reason=type(exc).__name__).inc()
            result = self._outcome(invocation_id, tool, decision, request.session,
                                   Status.rejected, Reason.policy, str(exc))
            await self._finish(client, result, admitted, transport=transport)
            raise
        except asyncio.CancelledError as exc:
            result = self._outcome(invocation_id, tool, decision, request.session,
                                   Status.killed, Reason.cancelled, None)
            if isinstance(exc, CancelledAfterCleanup):
                result.cleanup = exc.cleanup
            elif not started.is_set():  # cancelled while queued: nothing was started
                result.cleanup = Cleanup(verified=True, detail="cancelled before it started")
            with contextlib.suppress(ServiceError):
                await self._finish(client, result, admitted, transport=transport)
            raise
        except Exception as exc:
            log.exception("backend %s failed on %s", decision.backend, invocation_id)
            result = self._outcome(invocation_id, tool, decision, request.session,
                                   Status.error, Reason.exited, f"internal error: {exc}")
            await self._finish(client, result, admitted, ran=True, transport=transport)
            raise ExecutionFailure(f"the {decision.backend} backend failed: {exc}") from exc
        finally:
            if task is not None:
                self._inflight.discard(task)
        if session is not None:
            try:
                self.sessions.touch(session)
            except OSError as exc:  # the call ran: its result goes out and into the audit log
                log.warning("session %s: expiry not saved (%s); it stays in memory",
                            session.id, exc)
        return await self._finish(client, result, admitted, ran=True, transport=transport)

    async def _execute(self, client: str, invocation_id: str, tool: str, decision: Decision,
                       backend: Backend, session: Session | None, request: InvokeRequest,
                       limits: Limits, deadline: float, started: asyncio.Event) -> Result:
        try:
            async with self.scheduler.slot(client, deadline):
                started.set()
                async with self._workspace(session, invocation_id) as workspace:
                    invocation = Invocation(
                        id=invocation_id, tool=tool, kind=decision.kind or ToolKind.python,
                        client=client, session=request.session, workspace=workspace,
                        uid=self.sessions.identity(session, invocation_id),
                        arguments=request.arguments, plan=decision.plan, argv=decision.argv,
                        imports_allow=decision.imports_allow, imports_deny=decision.imports_deny,
                        image=decision.image, network=decision.network,
                        max_file_bytes=decision.max_file_bytes, path=decision.path,
                    )
                    result = await backend.run(invocation, limits, deadline)
                    result = await self._note_quota(result, decision, workspace)
        except DeadlineExpired as exc:
            return self._outcome(invocation_id, tool, decision, request.session, Status.timeout,
                                 Reason.wall_timeout, str(exc))
        return result.model_copy(update={"policy": decision.ref,
                                         "limits": result.limits or limits})

    @contextlib.asynccontextmanager
    async def _workspace(self, session: Session | None,
                         invocation_id: str) -> AsyncIterator[Path]:
        if session is not None:
            yield Path(session.workspace)
        else:
            async with self.sessions.temporary(invocation_id) as path:
                yield path

    async def _note_quota(self, result: Result, decision: Decision, workspace: Path) -> Result:
        """Tell the model when its workspace is full: a write that failed with ENOSPC (or,
        under an advisory quota, EFBIG at the per-file cap) otherwise reads as an obscure OS
        error."""
        if decision.kind not in (ToolKind.python, ToolKind.command):
            return result  # the file tools say it themselves
        usage: Usage | None = None
        with contextlib.suppress(OSError):
            usage = await self.sessions.usage(workspace)
        if usage is None or not (usage.full or usage.over):
            text = result.stderr[-8192:] + result.stdout[-4096:]
            if not any(s in text for s in ("No space left on device", "Disk quota exceeded")):
                return result
            # a one-shot container call has a tmpfs of its own (gone with the container): its
            # error is all there is to go by
            usage = Usage(0, 0, self.settings.session_quota_bytes,
                          self.settings.session_quota_entries)
        note = quota_message(usage)
        message = note if not result.message else f"{note} ({result.message})"
        return result.model_copy(update={"message": message})

    def _outcome(self, invocation_id: str, tool: str, decision: Decision, session: str | None,
                 status: Status, reason: Reason, message: str | None) -> Result:
        return Result.build(
            (invocation_id, tool, session), decision.backend, reason, status=status,
            limits=decision.limits, policy=decision.ref,
            cleanup=Cleanup(verified=status is not Status.killed), message=message,
        )

    async def _finish(self, client: str, result: Result, admitted: float, *,
                      ran: bool = False, transport: str = "http") -> Result:
        """Audit the result and count it. ``ran``: the call executed, so an audit failure
        must not be reported as a refusal: the result is kept, written late, and returned
        inside the :class:`AuditFailure`."""
        self.metrics.invocations.labels(tool=result.tool, status=result.status.value).inc()
        self.metrics.duration.labels(tool=result.tool).observe(time.monotonic() - admitted)
        try:
            await self._audit(self.audit.result, request_id=result.id, client=client,
                              result=result, transport=transport)
        except AuditFailure as exc:
            if not ran:
                raise
            self._unrecorded.append((client, result, transport))
            raise AuditFailure(
                f"the call ran (status {result.status.value}) but its result could not be "
                f"written to the audit log ({self._audit_failed}); it is written there as "
                "soon as the log is writable again; the result is attached",
                storage=exc.storage, result=result) from exc
        return result

    async def _audit(self, write: Any, **fields: Any) -> None:
        """Write an audit record (fsync happens in a thread so other calls keep flowing)."""
        try:
            if self._unrecorded:
                await asyncio.to_thread(self._flush_unrecorded)
            await asyncio.to_thread(write, **fields)
        except Exception as exc:
            log.error("audit write failed: %s", exc)
            self._audit_failed = str(exc)
            raise AuditFailure(
                "the audit log could not be written, so the call was refused (nothing ran); "
                f"the administrator must fix the audit log: {exc}", storage=is_no_space(exc),
            ) from exc
        self._audit_failed = None

    def _flush_unrecorded(self) -> None:
        """Write the results kept while the audit log failed (raises while it still fails)."""
        while self._unrecorded:
            client, result, transport = self._unrecorded[0]
            self.audit.result(request_id=result.id, client=client, result=result,
                              transport=transport)
            self._unrecorded.pop(0)

    def audit_problem(self) -> str | None:
        """Why the audit log cannot be written now (None: it can). After a failure, writing
        the kept results (or an ``audit_recovered`` record) is the proof that it can again."""
        full = full_reason(self.settings.audit_path.parent, "audit log's filesystem")
        if full is not None:
            return full
        if self._audit_failed is None and not self._unrecorded:
            return None
        try:
            self._flush_unrecorded()
            self.audit.write("audit_recovered", detail=self._audit_failed)
        except Exception as exc:
            self._audit_failed = str(exc)
            return f"the audit log cannot be written: {exc}"
        log.warning("the audit log is writable again")
        self._audit_failed = None
        return None

    async def _audit_watch(self, interval_s: float = 1.0) -> None:
        """Forever: once the audit log failed, retry until it works (results written late)."""
        while True:
            await asyncio.sleep(interval_s)
            if self._audit_failed is not None or self._unrecorded:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.audit_problem)

    def _check_state_dir(self) -> None:
        """Refuse work (507) before anything runs when the state directory is full."""
        why = full_reason(self.settings.state_dir, "state directory")
        if why is not None:
            self.metrics.rejections.labels(reason="storage_full").inc()
            raise StorageUnavailable(why)

    # ------------------------------------------------------------ sessions

    async def create_session(self, client: str, ttl_s: float | None, *,
                             transport: str = "http") -> Session:
        self._check_state_dir()
        try:
            session = await self.sessions.create(client, ttl_s)
        except OSError as exc:
            if is_no_space(exc):
                raise StorageUnavailable(f"no session can be created: the state directory is "
                                         f"full ({exc.strerror or exc})") from exc
            raise
        try:
            await self._audit(self.audit.write, event="session_created", client=client,
                              session=session.id, transport=transport)
        except AuditFailure:
            await self.sessions.drop(session)
            raise
        return session

    async def delete_session(self, client: str, session_id: str, *,
                             transport: str = "http") -> None:
        session = self.sessions.get(session_id, client)
        await self._close_session_backends(session)
        await self.sessions.delete(session_id, client)
        try:  # the session is gone either way: say so, and keep the failure in the log
            await self._audit(self.audit.write, event="session_deleted", client=client,
                              session=session_id, transport=transport)
        except AuditFailure as exc:
            log.error("session %s deleted without an audit record: %s", session_id, exc)

    async def _expire_session(self, session: Session) -> None:
        await self._close_session_backends(session)
        with contextlib.suppress(Exception):
            self.audit.write("session_expired", client=session.client, session=session.id)

    async def _end_session(self, session: Session) -> None:
        await self._close_session_backends(session)
        with contextlib.suppress(Exception):
            self.audit.write("session_expired", client=session.client, session=session.id,
                             reason="the daemon stopped (its workspace was in memory)")

    async def _close_session_backends(self, session: Session) -> None:
        for backend in self.backends.values():
            with contextlib.suppress(Exception):
                await backend.close_session(session.id)

    # ------------------------------------------------------------ readiness

    async def readiness(self, *, fresh: bool = False) -> dict[str, Any]:
        """Run each available backend's confinement probe (cached briefly); storage (audit
        log, state directory) and draining are read fresh every time."""
        storage = await asyncio.to_thread(self._storage_state)
        stored_ok = all(v["ok"] for v in storage.values())
        state = await self._probe_backends(fresh)
        state = {k: v for k, v in state.items() if not k.startswith("_")}
        quota = self.sessions.fs  # read fresh too: its mount helper may have died
        workspace_quota = {"mode": "kernel" if quota.kernel else "advisory",
                           "setting": quota.setting, "ok": quota.ok, "detail": quota.detail}
        policy = self._policy_state()
        degraded = [] if policy["ok"] else ["policy"]
        return {**state, "ready": state["ready"] and stored_ok and quota.ok
                and not self.draining, "draining": self.draining, "storage": storage,
                "workspace_quota": workspace_quota, "policy": policy, "degraded": degraded}

    def _storage_state(self) -> dict[str, dict[str, Any]]:
        audit = self.audit_problem()
        state = full_reason(self.settings.state_dir, "state directory")
        return {"audit_log": {"ok": audit is None, "detail": audit},
                "state_dir": {"ok": state is None, "detail": state}}

    async def _probe_backends(self, fresh: bool) -> dict[str, Any]:
        """Probe reports, cached while no backend's availability changed."""
        now = time.monotonic()
        available = {n: b.availability()[0] for n, b in self.backends.items()}
        if (not fresh and self._readiness and now - self._readiness[0] < READINESS_CACHE_S
                and self._readiness[1].get("_available") == available):
            return self._readiness[1]
        reports: dict[str, Any] = {}
        ready = True
        for name, backend in self.backends.items():
            ok, why = backend.availability()
            if not ok:
                reports[name] = {"available": False, "reason": why, "ok": name != DEFAULT_BACKEND}
                ready = ready and name != DEFAULT_BACKEND
                continue
            try:
                report: ProbeReport = await backend.probe()
            except Exception as exc:
                report = ProbeReport(backend=name, ok=False, detail=f"probe crashed: {exc}")
            reports[name] = {"available": True, **report.model_dump()}
            ready = ready and report.ok
        if DEFAULT_BACKEND not in self.backends:
            ready = False
        state = {"ready": ready, "backends": reports}
        self._readiness = (now, {**state, "_available": available})
        return state

    # ------------------------------------------------------------ policy events

    def _policy_event(self, event: str, fields: dict[str, Any]) -> None:
        """Audit a policy load or refusal and count it (the store logs it, once)."""
        self.metrics.policy_reloads.labels(
            result="refused" if event == "policy_refused" else "ok").inc()
        if event == "policy_refused":
            now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
            self._policy_refused = (now, list(fields.get("errors", [])))
        else:
            self._policy_refused = None
        try:
            self.audit.write(event, **fields)
        except Exception as exc:
            log.error("could not audit %s: %s", event, exc)
        if event == "policy_loaded":
            for listener in list(self.policy_listeners):
                try:
                    listener()
                except Exception:
                    log.exception("a policy listener failed")

    def _policy_state(self) -> dict[str, Any]:
        """The readiness view of the policy: ok, or the refused reload's problems (the
        previous policy stays in force, so this degrades readiness without failing it)."""
        if self._policy_refused is None:
            return {"ok": True, "detail": None}
        since, problems = self._policy_refused
        first = problems[0] if problems else "invalid policy"
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return {"ok": False, "since": since, "problems": problems,
                "detail": f"policy reload refused: {first}{more}; the previous policy stays "
                "in force"}


def _interrupted_calls(audit_path: Path) -> list[str]:
    """Request ids with an allowing decision but no result and not yet reported as
    interrupted, whatever the shutdown was (a crash, or a clean stop while the audit log could
    not take their results)."""
    try:
        with open(audit_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 4 * 1024 * 1024))
            lines = fh.read().splitlines()
    except OSError:
        return []
    open_calls: dict[str, None] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        event = record.get("event")
        rid = record.get("request_id")
        if event == "interrupted":
            for reported in record.get("requests") or ():
                open_calls.pop(reported, None)
        elif event == "decision" and rid and record.get("decision") == "allow":
            open_calls[rid] = None
        elif event == "result" and rid:
            open_calls.pop(rid, None)
    return list(open_calls)
