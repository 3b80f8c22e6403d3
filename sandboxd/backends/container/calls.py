"""One call on one container: the request sent to its runner, the exchange under the wall
deadline, and the :class:`~sandboxd.models.Result` built from what came back."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace

from sandboxd.backends import stdin as call_stdin
from sandboxd.backends.base import CancelledAfterCleanup
from sandboxd.backends.call import BackendCall
from sandboxd.backends.container import engine
from sandboxd.backends.container.boxes import Box, Boxes
from sandboxd.backends.container.runner import CallOutput, RunnerLost
from sandboxd.egress import sandbox as egress_sandbox
from sandboxd.models import (
    LIMIT_MESSAGES,
    Cleanup,
    Invocation,
    Limits,
    Reason,
    Resources,
    Result,
    Status,
    ToolKind,
    Truncated,
    status_for,
)
from sandboxd.protocol.call import RunnerPart, WorkerReport, WorkerRequest
from sandboxd.protocol.plan import KERNEL_KINDS, KERNEL_REQUESTS
from sandboxd.results.outputs import DisplayCollector
from sandboxd.util.deadline import stop_task, within

BACKEND = "container"
MAX_CODE_BYTES = 4 * 1024 * 1024
RUNNER_CONNECT_S = 15.0  # a started container's runner connects well within this
#: beyond an interrupt's grace, how long the daemon waits for the runner's answer (the runner
#: kills and reaps a kernel that did not come back well within this)
INTERRUPT_MARGIN_S = 2.0
#: the message of a call whose session container another call's limit removed under it
SUPERSEDED = ("the session's container was removed while this call ran, because another call "
              "of the session hit a limit; run it again")


@dataclass
class Outcome:
    """What one exchange with a runner gave: its output and exit record, or why it was lost."""

    output: CallOutput
    lost: str | None
    superseded: bool = False

    @property
    def record(self) -> WorkerReport:
        """The runner's exit record (an empty report when there was none)."""
        return self.output.exit or WorkerReport()

    def limit_hit(self, oom: bool = False) -> Reason | None:
        """The limit the call hit, if any (``oom``: the engine's word that it was OOM-killed);
        memory first, then output, then pids."""
        rec = self.record
        hits = ((rec.oom or oom, Reason.memory_limit),
                (self.output.over_limit or rec.output_limit, Reason.output_limit),
                (rec.pids_limit, Reason.pids_limit))
        return next((reason for hit, reason in hits if hit), None)

    @property
    def clean(self) -> bool:
        """The call ended by itself, within every limit: its container may be reused."""
        return (self.output.exit is not None and not self.lost and not self.superseded
                and self.limit_hit() is None and not self.record.error)

    @property
    def needs_oom_check(self) -> bool:
        """Ask the engine about OOM when the process died by SIGKILL or the runner vanished."""
        rec = self.record
        return not rec.oom and (self.lost is not None or rec.signal == 9)


async def oom_killed_after(boxes: Boxes, box: Box, outcome: Outcome) -> bool:
    """The engine's word on a call that did not end cleanly (one-shot and session calls
    alike): after a lost runner, whether the engine itself is going away; then, when the
    process died by SIGKILL or the runner vanished, whether the container was OOM-killed."""
    if outcome.lost is not None:
        await boxes.check_engine_after_lost_runner()
    if not outcome.needs_oom_check:
        return False
    return bool(await boxes.engine(engine.oom_killed, boxes.client, box.cid or box.name,
                                   runner_lost=outcome.lost is not None))


@dataclass
class Interrupt:
    """Interrupt before kill, for a call in a session kernel (so that it need not cost the
    session its state): at its deadline, on
    :meth:`request` (``POST /v1/sessions/{id}/interrupt``) or when it is cancelled, the runner
    is asked to interrupt the call (``I``: a KeyboardInterrupt in its code) and given
    ``grace`` seconds, plus a margin, to answer; only then is the call stopped (``K``)."""

    grace: float
    out: CallOutput | None = None  # the call's output (its id on the channel, once sent)
    reason: Reason | None = None  # why it was interrupted: wall_timeout or cancelled
    requested: bool = False
    wake: asyncio.Future[None] | None = field(default=None, repr=False)  # set by request()

    @property
    def running(self) -> bool:
        """The call is with the runner and has not ended."""
        return self.out is not None and self.out.cid is not None and self.out.exit is None

    def request(self) -> bool:
        """Interrupt the call now (``POST .../interrupt``); False when it is not running or
        is being interrupted already."""
        if not self.running or self.reason is not None or self.requested:
            return False
        self.requested = True
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)
        return True


@dataclass(frozen=True)
class ContainerCall:
    """One admitted call as the container backend's functions take it, built once in
    :meth:`ContainerBackend.run`: the backend call (invocation, limits, deadline, start), the
    runner request made of it, and the image and shape of the container that runs it."""

    call: BackendCall
    request: WorkerRequest
    image: str
    shape: engine.Shape

    @property
    def invocation(self) -> Invocation:
        """The admitted invocation (its plan, workspace, client, session)."""
        return self.call.invocation

    @property
    def limits(self) -> Limits:
        """The call's effective limits (its plan's)."""
        return self.call.limits


def not_started(exc: asyncio.CancelledError) -> CancelledAfterCleanup:
    """What a call cancelled before it had a container raises: the cancel as it came when it
    already says what was cleaned up, else that nothing was started."""
    if isinstance(exc, CancelledAfterCleanup):
        return exc
    return CancelledAfterCleanup(True, "no container was started")


class CancelledAfterInterrupt(asyncio.CancelledError):
    """A kernel call was cancelled; it was interrupted first, and ``outcome`` is what the
    runner answered within the grace (None: nothing, the call was stopped)."""

    def __init__(self, outcome: Outcome | None) -> None:
        super().__init__("cancelled")
        self.outcome = outcome


def request_for(call: BackendCall) -> WorkerRequest | Result:
    """The runner request of a call, or the result that rejects it."""
    invocation, plan = call.invocation, call.invocation.plan
    env = {"PATH": engine.CHILD_PATH, "HOME": "/workspace", "LANG": "C.UTF-8",
           "TMPDIR": "/tmp", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
           # matplotlib (the datascience image): no display, and its config and font cache
           # in the writable /tmp, not in the workspace or the read-only root
           "MPLBACKEND": "Agg", "MPLCONFIGDIR": "/tmp/matplotlib"}
    if plan.egress is not None:  # through the daemon's egress proxy (its forwarder)
        env.update(egress_sandbox.proxy_env(plan.egress))
    # the runner sets limits.rlimits() (soft = hard) in every process of the call and caps
    # its output at limits.output_bytes: protocol.limits, one table
    base = WorkerRequest(kind="python", id=invocation.id, limits=call.limits,
                         display=plan.display, runner=RunnerPart(env=env, cwd="/workspace"))
    if plan.kind is ToolKind.command:
        if plan.command is None:
            return rejected(call, "no command to run (the plan has none)")
        # the checked structure itself: the runner executes it, no shell is involved
        # a caller that feeds its stdin (sandboxd.backends.stdin): a pipe, not /dev/null
        return replace(base, kind="plan", plan=plan.command,
                       runner=replace(base.runner, stdin=call_stdin.requested() is not None))
    if plan.kind in KERNEL_KINDS:
        code = invocation.arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return rejected(call, "argument 'code' must be non-empty")
        if len(code.encode()) > MAX_CODE_BYTES:
            return rejected(call, "the code is too large")
        if plan.kind is ToolKind.bash:  # its kernel may execute these only
            return replace(base, kind="bash", code=code,
                           runner=replace(base.runner, programs=plan.programs))
        # python's imports, javascript's modules: the kernel's own check of the rule
        return replace(base, kind=KERNEL_REQUESTS[plan.kind], code=code,
                       imports_allow=plan.imports_allow, imports_deny=plan.imports_deny)
    return rejected(call, f"the container backend does not run {plan.kind} tools")


def rejected(call: BackendCall, message: str) -> Result:
    """A call the backend refuses before any container is involved."""
    return Result.build(call.invocation, BACKEND, Reason.policy, status=Status.rejected,
                        limits=call.limits, cleanup=Cleanup(verified=True), message=message)


async def exchange(box: Box, call: ContainerCall,
                   interrupt: Interrupt | None = None) -> Outcome:
    """Run ``call``'s request on ``box`` within its deadline (raises TimeoutError), its
    output streamed to the invocation's sink when it has one. With ``interrupt`` (a kernel
    call), the deadline, a request and
    a cancel interrupt the call first (see :class:`Interrupt`): the outcome is then the
    runner's answer to the interrupt (``interrupt.reason`` says why), TimeoutError or
    :class:`CancelledAfterInterrupt` when it did not answer within the grace.

    The deadline is enforced with ``asyncio.wait`` around a task, never with nested
    ``wait_for``/``timeout`` (Python 3.11's ``wait_for`` can swallow a cancellation that
    races with completion, which would let a call outlive its deadline).
    """
    request, deadline = call.request, call.call.deadline
    out = CallOutput(displays=DisplayCollector(request.display),
                     events=call.invocation.events,
                     stdin=call_stdin.requested() if request.runner.stdin else None)
    if deadline - time.monotonic() <= 0:
        raise TimeoutError
    task = asyncio.ensure_future(_exchange_body(box, call, out))
    if interrupt is not None:
        interrupt.out = out
        return await _interruptible(box, task, deadline, interrupt)
    finished, result = await within(task, deadline - time.monotonic())
    if not finished:
        raise TimeoutError
    return result


async def _interruptible(box: Box, task: asyncio.Future[Outcome], deadline: float,
                         interrupt: Interrupt) -> Outcome:
    # one asyncio.wait, as within() does, on the call and on an interrupt request (it cancels
    # neither, and a cancellation of ours is never lost: it is handled here)
    wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    interrupt.wake = wake
    either: set[asyncio.Future[Outcome] | asyncio.Future[None]] = {task, wake}
    try:
        await asyncio.wait(either, timeout=max(deadline - time.monotonic(), 0),
                           return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        if not task.done():
            interrupt.reason = Reason.cancelled
        try:
            outcome = await asyncio.shield(_interrupted(box, task, interrupt))
        except asyncio.CancelledError:  # cancelled again: no more waiting
            await stop_task(task)
            raise CancelledAfterInterrupt(None) from None
        raise CancelledAfterInterrupt(outcome) from None
    if task.done():
        return task.result()
    interrupt.reason = Reason.cancelled if interrupt.requested else Reason.wall_timeout
    outcome = await _interrupted(box, task, interrupt)
    if outcome is None:
        raise TimeoutError
    return outcome


async def _interrupted(box: Box, task: asyncio.Future[Outcome],
                       interrupt: Interrupt) -> Outcome | None:
    """Ask the runner to interrupt the call and wait for its answer, within the grace and a
    margin; None (and the call stopped: ``K``) when none came, or the call never reached the
    runner."""
    if not task.done():
        channel, out = box.endpoint.channel, interrupt.out
        if channel is None or out is None or out.cid is None or not channel.interrupt(out.cid):
            await stop_task(task)
            return None if task.cancelled() or task.exception() else task.result()
        finished, _ = await within(task, interrupt.grace + INTERRUPT_MARGIN_S)
        if not finished:  # stopped (``K``): the runner kills the kernel
            return None
    return task.result()


async def _exchange_body(box: Box, call: ContainerCall, out: CallOutput) -> Outcome:
    endpoint = box.endpoint
    if not endpoint.settled.is_set():
        started, _ = await within(endpoint.settled.wait(), RUNNER_CONNECT_S)
        if not started:
            return Outcome(out, (
                f"the sandbox runner of image {box.image} did not start within "
                f"{RUNNER_CONNECT_S:g} s; images must be built FROM the sandboxd image "
                "(see images/)"))
    if endpoint.channel is None:
        return Outcome(out, f"no sandbox runner channel: {endpoint.failure}")
    try:
        await endpoint.channel.call(call.request, call.limits.output_bytes, out)
    except RunnerLost as exc:
        return Outcome(out, str(exc))
    return Outcome(out, None)


def timeout_result(call: BackendCall, verified: bool, detail: str) -> Result:
    """The result of a call that ran past its wall deadline."""
    return Result.build(call.invocation, BACKEND, Reason.wall_timeout, limits=call.limits,
                        started=call.started, cleanup=Cleanup(verified=verified, detail=detail))


def build_result(call: BackendCall, outcome: Outcome, verified: bool, *, oom: bool,
                 detail: str | None, engine_error: str | None,
                 interrupted: Reason | None = None) -> Result:
    """The result of a call that reached its runner (``engine_error``: why the engine was
    last seen failing, if it was; ``interrupted``: the call was interrupted at its deadline
    or on a cancel, which is its termination unless it hit a limit)."""
    out, rec = outcome.output, outcome.record
    reason, message = _ending(call.limits, outcome, oom, engine_error, interrupted)
    status = status_for(reason, rec.exit_code)
    if (outcome.lost or rec.error) and not outcome.superseded and reason is not interrupted:
        status = Status.error
    truncated = Truncated()
    if reason is Reason.output_limit:
        truncated = Truncated(stdout=out.last_stream == "stdout",
                              stderr=out.last_stream == "stderr")
    value, value_repr = (rec.value, rec.value_repr) if rec.has_value else (None, None)
    return Result.build(
        call.invocation, BACKEND, reason, status=status, exit_code=rec.exit_code,
        signal=rec.signal,
        stdout=out.stdout.decode("utf-8", errors="replace"),
        stderr=out.stderr.decode("utf-8", errors="replace"),
        truncated=truncated, value=value, value_repr=value_repr,
        resources=Resources(wall_ms=int((time.monotonic() - call.started) * 1000),
                            cpu_ms=rec.cpu_ms, peak_memory_bytes=rec.peak_memory_bytes),
        limits=call.limits,
        cleanup=Cleanup(verified=verified, detail=detail),
        message=message,
        outputs=list(out.displays.items),
    )


def _ending(limits: Limits, outcome: Outcome, oom: bool, engine_error: str | None,
            interrupted: Reason | None) -> tuple[Reason, str | None]:
    """Why a call that reached its runner ended, and the message that says so (None: the
    reason's own, from the one table in :meth:`Result.build`); the first that applies of:
    superseded, a limit, an interrupt, a lost runner, the runner's error, its exit."""
    rec = outcome.record
    if outcome.superseded:
        return Reason.cancelled, SUPERSEDED
    limit = outcome.limit_hit(oom)
    if limit is not None:
        return limit, None
    if interrupted is not None:
        why = rec.not_idle or rec.error or outcome.lost
        if not why:
            return interrupted, None
        return interrupted, (f"{LIMIT_MESSAGES[interrupted].format(**limits.to_wire())}; "
                             f"{str(why).rstrip('.')}")
    if outcome.lost:
        if engine_error is not None:
            return Reason.exited, f"the Docker engine went away during the call ({outcome.lost})"
        return Reason.exited, outcome.lost
    if rec.error:
        return Reason.exited, rec.error
    # the exception line of a call that failed, as the restricted backend's
    return Reason.exited, rec.message if rec.exit_code != 0 else None
