"""Session containers: one long-lived container per (client, session, image) with the
session's workspace bind-mounted at ``/workspace``; each command call is one fork of its
runner, and the session's ``python`` calls run in its **kernel**: one persistent interpreter
the runner keeps in the container (globals persist between calls; one call at a time, in
order). The container is removed by ``close_session``, at shutdown, and after any call that
hit a limit (the next call starts a fresh one on the same workspace, with a fresh kernel). A
kernel call that crashes the interpreter ends only the kernel; ``restart`` ends it on
request. A session's ``bash`` calls run in its bash kernel, in a container of their own
(:data:`BASH_KEY`: one kernel per container, and a limit hit by one language's call does
not cost the other its state; the workspace is the same).

Kernels you can trust (code in a kernel is hostile and may lie about being done): the runner
ends a kernel call only once it has proven from ``/proc`` that the kernel is back in its loop and
idle (code that writes a forged answer and runs on is never answered; its call ends at the deadline
with the kernel lost), and it ends a kernel whose call left threads running. Interrupt before kill:
at a kernel call's deadline, on a cancel and on :meth:`SessionContainers.interrupt_kernel` the
runner interrupts the call (a KeyboardInterrupt in its code); a kernel that comes back within
``kernel_interrupt_grace_s`` is kept with its variables (``kernel.interrupted``; the call ends
``timeout`` or ``killed``), else it is killed and its container removed as before."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Iterator
from dataclasses import replace

from sandboxd.backends.base import CancelledAfterCleanup
from sandboxd.backends.container.boxes import Box, Boxes, gone
from sandboxd.backends.container.calls import (
    BACKEND,
    CancelledAfterInterrupt,
    ContainerCall,
    Interrupt,
    Outcome,
    build_result,
    exchange,
    not_started,
    oom_killed_after,
    timeout_result,
)
from sandboxd.backends.container.idle import Idle, ThawFailed
from sandboxd.backends.container.runner import CallOutput, RunnerLost
from sandboxd.backends.kernel_verdict import LEFT, Ended, Observed, Verdict, kernel_verdict
from sandboxd.models import Cleanup, Invocation, Kernel, Reason, Result, Status, ToolKind
from sandboxd.protocol.call import WorkerReport, WorkerRequest
from sandboxd.protocol.packages import WHEELHOUSE_CAME_LATER
from sandboxd.protocol.plan import KERNEL_LANES, KERNEL_REQUESTS
from sandboxd.tools import PACKAGES_TOOL
from sandboxd.util.deadline import within

SessionKey = tuple[str, str, str]  # (client, session, image + its language's lane)
#: a session's bash calls get a container of their own (its runner's bash kernel), keyed so
BASH_KEY = KERNEL_LANES[ToolKind.bash]


def lane_language(lane: str) -> str:
    """The language of the kernel a session container of ``lane`` (a key's third part) runs:
    python, or the language its lane names after the image (no image name has a space)."""
    return lane.rsplit(" ", 1)[1] if " " in lane else ToolKind.python.value


def session_key(invocation: Invocation, image: str) -> SessionKey:
    """The key of the session container that runs ``invocation`` (KERNEL_LANES: a language
    whose kernel has a container of its own)."""
    lane = image + KERNEL_LANES.get(invocation.plan.kind, "")
    return (invocation.client, invocation.session or "", lane)



KERNEL_STOP_S = 10.0
#: how many closed sessions are remembered (a call of one comes seconds late at most)
CLOSED_MEMORY = 4096  # the runner kills and reaps the kernel well within this
#: the report of a call the runner did not answer (or whose report says nothing of a kernel)
NO_REPORT = WorkerReport()


class SessionContainers:
    """The live session containers, one per :data:`SessionKey`."""

    def __init__(self, boxes: Boxes) -> None:
        self.boxes = boxes
        self.by_key: dict[SessionKey, Box] = {}
        self._locks: dict[SessionKey, asyncio.Lock] = {}
        self._kernel_locks: dict[SessionKey, asyncio.Lock] = {}  # one kernel call at a time
        self._flights: dict[SessionKey, Interrupt] = {}  # the kernel call running now
        #: idle containers are paused, thawed at their next call (no CPU
        #: while idle)
        self.idle = Idle(boxes, boxes.config.session_pause_after_s)
        #: sessions closed lately: no container is ever made for one again (the service ends
        #: a session's calls before it closes it; this holds whatever else comes late)
        self.closed: collections.OrderedDict[str, None] = collections.OrderedDict()

    def lost(self) -> None:
        """The engine went away: every session container is dead, removed when it is back."""
        for key, box in list(self.by_key.items()):
            box.dead = True
            del self.by_key[key]
            self.boxes.stale.add(box)

    def kernel_sessions(self) -> set[str]:
        """Sessions with a live kernel."""
        return {session for session, _ in self.session_kernels()}

    def session_kernels(self) -> set[tuple[str, str]]:
        """``(session, language)`` of each live kernel."""
        return {(key[1], lane_language(key[2])) for key, box in self.by_key.items()
                if box.kernel_calls and not box.dead}

    def paused_sessions(self) -> set[str]:
        """Sessions whose container is paused now (idle)."""
        return {key[1] for key, box in self.by_key.items() if box.paused and not box.dead}

    def kernel_now(self, invocation: Invocation, image: str) -> Kernel:
        """The session kernel's state as it is (for a call that did not reach it)."""
        return self._kernel_at(session_key(invocation, image))

    def _kernel_at(self, key: SessionKey) -> Kernel:
        """The kernel state of the session container at ``key`` (no calls: none, or dead)."""
        box = self.by_key.get(key)
        return Kernel(calls=box.kernel_calls if box is not None and not box.dead else 0)

    async def _box(self, key: SessionKey, call: ContainerCall) -> Box:
        invocation, plan = call.invocation, call.invocation.plan
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            self._check_open(key)
            box = self.by_key.get(key)
            if box is not None and box.prestarted and not box.dead:
                box.prestarted = False  # (:mod:`.ready`) made with no network and no egress
                if plan.network is not None or plan.egress is not None:
                    await self.drop(key, box)  # its call wants them: one made for it
            if box is not None and not box.dead and self.by_key.get(key) is box:
                if box.egress is not None and plan.egress is not None:
                    # this call's decision, under the policy in force now: new connections
                    # follow it, open ones it no longer allows are cut
                    box.egress.tool = invocation.tool
                    self.boxes.egress_proxy.update(box.egress, plan.egress)
                return box
            if not invocation.workspace.is_dir():  # never made anew: the engine would
                raise RuntimeError(f"the workspace of session {key[1]} is missing")
            new = await self.boxes.new_within(
                self.boxes.new(image=call.image, shape=call.shape, role="session",
                               invocation=invocation.id, workspace=invocation.workspace,
                               network=plan.network, session=invocation.session,
                               uid=invocation.uid, egress=plan.egress,
                               client=invocation.client, tool=invocation.tool),
                call.call.left())
            if new is None:
                raise TimeoutError
            self.by_key[key] = new
            return new

    async def run(self, call: ContainerCall) -> Result:
        """Run one call of a session in its container (started here when it has none);
        a ``python`` call runs in the session's kernel, after the session's earlier ones."""
        assert call.invocation.session is not None
        key = session_key(call.invocation, call.image)
        with self.idle.using(key):  # its container is not paused while the call runs
            return await self._serial(key, call)

    async def _serial(self, key: SessionKey, call: ContainerCall) -> Result:
        """A session call, after the session's earlier ``python`` calls when it is one."""
        if call.request.kind not in KERNEL_REQUESTS.values():
            return await self._run(key, call)
        lock = self._kernel_locks.setdefault(key, asyncio.Lock())
        try:
            got, _ = await within(lock.acquire(), call.call.left(),
                                  orphan=lambda _: lock.release())
        except asyncio.CancelledError:
            raise CancelledAfterCleanup(True, "the call had not started: it waited for the "
                                              "session's earlier calls") from None
        if got and key[1] in self.closed:  # it ended while this call waited for its kernel
            lock.release()
            self._check_open(key)
        if not got:  # the session's earlier calls ran past this one's deadline
            result = timeout_result(call.call, True, "the call waited for the session's "
                                    "earlier calls and never started")
            return with_kernel(result, self._kernel_at(key))
        grace = self.boxes.config.kernel_interrupt_grace_s
        interrupt = self._flights[key] = Interrupt(grace)
        try:
            kernel_request = replace(call.request, kernel=True, runner=replace(
                call.request.runner, interrupt_grace_s=grace))
            return await self._run(key, replace(call, request=kernel_request), interrupt)
        finally:
            if self._flights.get(key) is interrupt:
                del self._flights[key]
            lock.release()

    async def _run(self, key: SessionKey, call: ContainerCall,
                   interrupt: Interrupt | None = None) -> Result:
        kernel_call = call.request.kernel
        box: Box | None = None
        before = 0  # calls of the box's live kernel before this one (0: none)
        try:
            box = await self._box(key, call)
            before = box.kernel_calls
            if call.invocation.tool == PACKAGES_TOOL and box.wheelhouse is False:
                return Result.build(call.invocation, BACKEND, Reason.policy,
                                    status=Status.error, limits=call.limits,
                                    started=call.call.started, message=WHEELHOUSE_CAME_LATER)
            await self.idle.thaw(key, box)  # before anything talks to it
            await self.boxes.update_shape(box, call.shape)
            outcome = await exchange(box, call, interrupt)
        except asyncio.CancelledError as exc:
            if box is None:
                raise not_started(exc) from None
            raise await self._cancelled(key, box, exc, kernel_call, before) from None
        except ThawFailed as exc:
            assert box is not None
            return await self._thaw_failed(key, box, call, exc, before)
        except TimeoutError:
            verified = await self.drop(key, box) if box is not None else True
            result = timeout_result(call.call, verified, gone(box, verified))
            return with_lost(result, Ended.TIMEOUT, kernel_call, before)
        except BaseException:
            if box is not None:
                await self.drop(key, box)
            raise
        return await self._answer(key, box, call, outcome,
                                  interrupt.reason if interrupt is not None else None, before)

    async def _cancelled(self, key: SessionKey, box: Box, exc: asyncio.CancelledError,
                         kernel_call: bool, before: int) -> CancelledAfterCleanup:
        """A cancelled call: its kernel kept when the runner kept it (interrupted and back,
        or the call ended by itself), else its container (and so its kernel) removed."""
        if isinstance(exc, CancelledAfterInterrupt) and exc.outcome is not None:
            kept = self._kept_after_interrupt(box, exc.outcome)
            if kept is not None:  # interrupted, back and idle: kernel and box stay
                return CancelledAfterCleanup(*kept)
        verified = await self.drop(key, box)
        lost = gone_kernel(Ended.CANCELLED, kernel_call, before)
        return CancelledAfterCleanup(verified, gone(box, verified), lost)

    async def _thaw_failed(self, key: SessionKey, box: Box, call: ContainerCall,
                           exc: ThawFailed, before: int) -> Result:
        """A call whose paused container could not be thawed: the container is removed (and
        its kernel with it), the call ends in error, the session's next call gets a new one."""
        verified = await self.drop(key, box)
        return Result.build(
            call.invocation, BACKEND, Reason.exited, status=Status.error,
            limits=call.limits, started=call.call.started,
            message=f"{exc}; it was removed and the session's next call gets a new one "
            "(its files are kept)",
            cleanup=Cleanup(verified=verified, detail=gone(box, verified)),
            kernel=kernel_verdict(Observed(Ended.THAW_FAILED, False, before,
                                           has_kernel=bool(call.request.kernel or before))).kernel)

    async def _answer(self, key: SessionKey, box: Box, call: ContainerCall, outcome: Outcome,
                      interrupted: Reason | None, before: int) -> Result:
        """The result of a call the runner answered: the container (and its kernel) kept
        when the call ended within every limit (an interrupted call: and its kernel was not
        lost), else removed."""
        if outcome.lost and box.dead:
            # another call of this session hit a limit and its container was removed
            outcome.lost = None
            outcome.superseded = True
        rec = outcome.record
        if not outcome.clean or (interrupted is not None and rec.kernel_lost):
            return await self._removed(key, box, call, outcome, interrupted, before)
        verified = rec.group_gone is not False
        if interrupted is not None and rec.kernel_interrupted:  # back within the grace: kept
            verdict = _back_after_interrupt(box, rec, Ended.FINISHED, interrupted=True)
            result = build_result(call.call, outcome, verified, oom=False,
                                  detail=verdict.detail, engine_error=self.boxes.engine_error,
                                  interrupted=interrupted)
            return with_kernel(result, verdict.kernel)
        # (interrupted, it ended by itself as it was interrupted: its own result)
        result = build_result(call.call, outcome, verified, oom=False,
                              detail="session container kept; the call's processes are "
                              "gone" if verified else LEFT,
                              engine_error=self.boxes.engine_error)
        return self._kernel_kept(box, outcome, result) if call.request.kernel else result

    async def _removed(self, key: SessionKey, box: Box, call: ContainerCall, outcome: Outcome,
                       interrupted: Reason | None, before: int) -> Result:
        """The result of an answered call whose container goes (a limit, a lost runner or
        kernel): asked of the engine whether it was OOM-killed, then removed."""
        oom = await oom_killed_after(self.boxes, box, outcome)
        verified = await self.drop(key, box)
        result = build_result(call.call, outcome, verified, oom=oom,
                              detail=gone(box, verified) + " (the session gets a new one)",
                              engine_error=self.boxes.engine_error, interrupted=interrupted)
        kernel_call = call.request.kernel
        return with_lost(result, Ended.FINISHED, kernel_call, before,
                         outcome.record if kernel_call else NO_REPORT)

    @staticmethod
    def _kernel_kept(box: Box, outcome: Outcome, result: Result) -> Result:
        """A kernel call that ended within every limit (the container is kept): the kernel
        lives on, or it crashed or was restarted meanwhile."""
        rec = outcome.record
        verdict = kernel_verdict(Observed(
            Ended.FINISHED, bool(rec.kernel_fresh), rec.kernel_calls or 0,
            back=not rec.kernel_lost, stopped="restarted" if rec.kernel_stopped else None,
            not_idle=rec.not_idle, crashed=True, signal=rec.signal, exit_code=rec.exit_code,
            old_runner=box.image if rec.kernel_calls is None else None))
        assert verdict.kernel is not None
        if rec.kernel_calls is not None:  # None: a runner without kernels ran it one-shot
            box.kernel_calls = 0 if verdict.kernel.lost else rec.kernel_calls
        # the verdict's message, else its why when the call's result has no message of its own
        message = verdict.message or (verdict.why if result.message is None else result.message)
        return result.model_copy(update={"kernel": verdict.kernel, "message": message})

    @staticmethod
    def _kept_after_interrupt(box: Box,
                              outcome: Outcome) -> tuple[bool, str | None, Kernel | None] | None:
        """A cancelled kernel call's kernel, when the runner kept it (it came back from the
        interrupt, or the call ended by itself): ``CancelledAfterCleanup``'s arguments."""
        rec = outcome.record
        if not outcome.clean or rec.kernel_lost or rec.kernel_calls is None:
            return None
        verdict = _back_after_interrupt(box, rec, Ended.CANCELLED,
                                        interrupted=bool(rec.kernel_interrupted))
        return rec.group_gone is not False, verdict.detail, verdict.kernel

    def interrupt_kernel(self, session_id: str) -> bool:
        """Interrupt the python call that runs in the session's kernel now, if any: its code
        gets a KeyboardInterrupt; it ends ``killed`` (``cancelled``), and the kernel is kept
        when it comes back within the grace. True when a call was running."""
        hit = False
        for key, interrupt in self._flights.items():
            if key[1] == session_id and interrupt.request():
                hit = True
        return hit

    def _live(self, session_id: str) -> Iterator[tuple[SessionKey, Box]]:
        """The session's containers that are alive, each checked as it comes (the caller
        awaits between them: one may die meanwhile)."""
        for key, box in list(self.by_key.items()):
            if key[1] == session_id and not box.dead:
                yield key, box

    async def restart_kernel(self, session_id: str) -> bool:
        """End the session's kernel(s) (the next python call starts a fresh one; the
        container and workspace are kept). True when a kernel was ended."""
        ended = False
        for key, box in self._live(session_id):
            with self.idle.using(key):
                ended = await self._restart(key, box) or ended
        return ended

    async def pause_session(self, session_id: str) -> bool:
        """Pause the session's container(s) now, as an idle one is paused (never while a call
        runs in it). True when one is paused after this (by it, or already)."""
        paused = False
        for key, box in self._live(session_id):
            now = await self.idle.pause(key, box, self.by_key, now=True)
            paused = paused or now or box.paused
        return paused

    async def resume_session(self, session_id: str) -> bool:
        """Thaw the session's paused container(s), as its next call would; True when one was
        thawed. One that cannot be is dropped (its next call gets a fresh one; its kernel is
        lost) and :class:`ThawFailed` raised."""
        thawed = False
        for key, box in self._live(session_id):
            if not box.paused:
                continue
            with self.idle.using(key):
                try:
                    await self.idle.thaw(key, box)
                except ThawFailed:
                    await self.drop(key, box)
                    raise
            thawed = True
        return thawed

    async def _restart(self, key: SessionKey, box: Box) -> bool:
        """End one session container's kernel (thawed first); True when one was ended."""
        try:
            await self.idle.thaw(key, box)
        except ThawFailed:
            channel = None  # the container goes (and its kernel with it)
        else:
            channel = box.endpoint.channel
        if channel is not None:
            out = CallOutput()
            with contextlib.suppress(RunnerLost):
                done, _ = await within(
                    channel.call(WorkerRequest.stop_kernel(), 0, out), KERNEL_STOP_S)
                if done and out.exit is not None:
                    box.kernel_calls = 0
                    return bool(out.exit.kernel_lost)
        # no answer: the container goes (and its kernel with it)
        ended = bool(box.kernel_calls)
        await self.drop(key, box)
        return ended

    def _check_open(self, key: SessionKey) -> None:
        """Refuse a call of a closed session (cancelled: nothing was started)."""
        if key[1] in self.closed:
            raise CancelledAfterCleanup(True, "the session was closed: no container was "
                                              "started")

    async def drop(self, key: SessionKey, box: Box) -> bool:
        """Forget and remove one session container; True once its removal is confirmed
        (:meth:`Boxes.destroy_holding_uid`)."""
        if self.by_key.get(key) is box:
            del self.by_key[key]
        box.kernel_calls = 0
        return await self.boxes.destroy_holding_uid(box)

    async def close(self, session_id: str) -> None:
        """Remove the session's container(s); none is made for it from now on. Idempotent."""
        self.closed[session_id] = None
        while len(self.closed) > CLOSED_MEMORY:
            self.closed.popitem(last=False)
        keys = [k for k in self.by_key if k[1] == session_id]
        await asyncio.gather(*(self.drop(k, self.by_key[k]) for k in keys),
                             return_exceptions=True)
        for key in keys:
            self._locks.pop(key, None)
            self._kernel_locks.pop(key, None)
            self.idle.forget(key)


def _back_after_interrupt(box: Box, rec: WorkerReport, ended: Ended, *,
                          interrupted: bool) -> Verdict:
    """The verdict on a kernel the runner kept through an interrupt (back in its loop within
    the grace, or its call ended by itself as it was interrupted); its calls are counted on
    its container."""
    box.kernel_calls = rec.kernel_calls or 0
    return kernel_verdict(Observed(
        ended, bool(rec.kernel_fresh), box.kernel_calls, back=True, interrupted=interrupted,
        verified=rec.group_gone is not False))


def with_kernel(result: Result, kernel: Kernel | None) -> Result:
    """``result`` carrying the session kernel's state."""
    return result.model_copy(update={"kernel": kernel})


def gone_kernel(ended: Ended, kernel_call: bool, before: int, rec: WorkerReport = NO_REPORT,
                termination: Reason | None = None) -> Kernel | None:
    """The kernel of a call whose container is gone (and so its kernel): ``rec`` the
    runner's report of the call and ``termination`` its result's reason, when it answered;
    None when the session had no kernel."""
    fresh = rec.kernel_fresh
    calls = rec.kernel_calls or before + kernel_call
    return kernel_verdict(Observed(
        ended, bool(kernel_call and not before if fresh is None else fresh), calls,
        has_kernel=bool(kernel_call or before), termination=termination)).kernel


def with_lost(result: Result, ended: Ended, kernel_call: bool, before: int,
              rec: WorkerReport = NO_REPORT) -> Result:
    """``result`` carrying its session's lost kernel, when the session had one."""
    kernel = gone_kernel(ended, kernel_call, before, rec, result.termination.reason)
    return result if kernel is None else with_kernel(result, kernel)
