"""An admitted call run in its slot and its workspace (the session's, or a temporary one), and
the results the service makes itself."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, replace
from pathlib import Path

from sandboxd.backends.base import Backend
from sandboxd.config import Settings
from sandboxd.invoke.steps import QuotaSeen
from sandboxd.models import (
    Cleanup,
    Decision,
    Invocation,
    InvokeRequest,
    Reason,
    Result,
    Status,
)
from sandboxd.protocol.display import DisplayCaps
from sandboxd.protocol.plan import KERNEL_KINDS, ExecutionPlan, ToolKind
from sandboxd.results.streaming import EventSink
from sandboxd.scheduler import ClientPools, DeadlineExpired, Scheduler
from sandboxd.sessions.manager import Session, SessionManager
from sandboxd.sessions.restarts import Restarts, kernel_of
from sandboxd.workspaces.quota import Usage
from sandboxd.workspaces.transfer import Transfer


@dataclass(frozen=True)
class AdmittedCall:
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


def own_result(invocation_id: str, tool: str, decision: Decision, session: str | None,
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


class Execution:
    """Runs admitted calls: a slot (an execution slot, or a raw transfer's own client
    pool), the session's liveness checked again, its workspace, its backend."""

    def __init__(self, settings: Settings, scheduler: Scheduler, transfers: ClientPools,
                 sessions: SessionManager, restarts: Restarts) -> None:
        self.settings = settings
        self.scheduler = scheduler
        self.transfers = transfers
        self.sessions = sessions
        self.restarts = restarts

    async def plan(self, decision: Decision, session: Session | None) -> ExecutionPlan:
        """An allowed decision's plan, plus what the service owns: display caps, and the
        advisory quota's room (checked: a full session's call is refused here)."""
        assert decision.plan is not None  # an allowed decision carries what runs
        plan = replace(decision.plan, display=DisplayCaps(self.settings.max_display_bytes,
                                                          self.settings.max_displays))
        if session is not None and plan.kind in (*KERNEL_KINDS, ToolKind.command):
            used = await self.sessions.check_quota(session)
            if not self.sessions.fs.kernel:
                # advisory quota: no single file may take more than what is left of it
                left = max(used.quota_bytes - used.bytes, 0)
                plan = replace(plan, max_file_bytes=min(plan.max_file_bytes, left))
        return plan

    async def run(self, call: AdmittedCall, deadline: float,
                  started: asyncio.Event) -> tuple[Result, QuotaSeen | None]:
        """Run ``call``; its result, and its workspace as the call left it (None: not
        measured)."""
        limits, session = call.plan.limits, call.request.session
        seen: QuotaSeen | None = None
        try:
            # a raw transfer never takes an execution slot: its client's transfer slots
            slots = self.scheduler if call.transfer is None else self.transfers
            async with slots.slot(call.client, deadline):
                self.sessions.check_live(call.session)  # it may have ended while we waited
                started.set()
                if call.plan.kind in KERNEL_KINDS:  # a crash during this call loses it
                    self.restarts.note_kernel_starting(
                        call.session, kernel_of(call.decision.backend, call.plan.kind))
                async with self.sessions.workspace(call.session, call.id) as workspace:
                    invocation = Invocation(
                        id=call.id, tool=call.tool, client=call.client, session=session,
                        workspace=workspace, uid=self.sessions.identity(call.session, call.id),
                        arguments=call.request.arguments, plan=call.plan,
                        transfer=call.transfer, events=call.events)
                    result = await call.backend.run(invocation, deadline)
                    seen = await self._quota_seen(call.plan, workspace)
        except DeadlineExpired as exc:
            return own_result(call.id, call.tool, call.decision, session, Status.timeout,
                              Reason.wall_timeout, str(exc)), None
        return result.model_copy(update={"policy": call.decision.ref,
                                         "limits": result.limits or limits,
                                         "approval": call.decision.approval}), seen

    async def _quota_seen(self, plan: ExecutionPlan, workspace: Path) -> QuotaSeen | None:
        """The workspace after a python or command call (the file tools say a full one
        themselves: None)."""
        if plan.kind not in (*KERNEL_KINDS, ToolKind.command):
            return None
        usage: Usage | None = None
        with contextlib.suppress(OSError):
            usage = await self.sessions.usage(workspace)
        return QuotaSeen(usage, Usage(0, 0, self.settings.session_quota_bytes,
                                      self.settings.session_quota_entries))
