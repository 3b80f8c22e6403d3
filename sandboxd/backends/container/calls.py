"""One call on one container: the request sent to its runner, the exchange under the wall
deadline, and the :class:`~sandboxd.models.Result` built from what came back."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace

from sandboxd.backends import stdin as call_stdin
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
from sandboxd.protocol.call import WorkerReport, WorkerRequest
from sandboxd.protocol.plan import KERNEL_KINDS, KERNEL_REQUESTS
from sandboxd.results.outputs import DisplayCollector
from sandboxd.results.streaming import EventSink
from sandboxd.util.deadline import stop_task, within

BACKEND = "container"
MAX_CODE_BYTES = 4 * 1024 * 1024
RUNNER_CONNECT_S = 15.0  # a started container's runner connects well within this
#: beyond an interrupt's grace, how long the daemon waits for the runner's answer (the runner
#: kills and reaps a kernel that did not come back well within this)
INTERRUPT_MARGIN_S = 2.0


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

    @property
    def clean(self) -> bool:
        """The call ended by itself, within every limit: its container may be reused."""
        rec = self.record
        return (self.output.exit is not None and not self.lost and not self.superseded
                and not self.output.over_limit
                and not rec.oom and not rec.pids_limit
                and not rec.output_limit and not rec.error)

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


class CancelledAfterInterrupt(asyncio.CancelledError):
    """A kernel call was cancelled; it was interrupted first, and ``outcome`` is what the
    runner answered within the grace (None: nothing, the call was stopped)."""

    def __init__(self, outcome: Outcome | None) -> None:
        super().__init__("cancelled")
        self.outcome = outcome


def request_for(invocation: Invocation, limits: Limits) -> WorkerRequest | Result:
    """The runner request of a call, or the result that rejects it."""
    env = {"PATH": engine.CHILD_PATH, "HOME": "/workspace", "LANG": "C.UTF-8",
           "TMPDIR": "/tmp", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
           # matplotlib (the datascience image): no display, and its config and font cache
           # in the writable /tmp, not in the workspace or the read-only root
           "MPLBACKEND": "Agg", "MPLCONFIGDIR": "/tmp/matplotlib"}
    if invocation.plan.egress is not None:  # through the daemon's egress proxy (its forwarder)
        env.update(egress_sandbox.proxy_env(invocation.plan.egress))
    # the runner sets limits.rlimits() (soft = hard) in every process of the call and caps
    # its output at limits.output_bytes: protocol.limits, one table
    base = WorkerRequest(kind="python", id=invocation.id, env=env, cwd="/workspace",
                         limits=limits, display=invocation.plan.display)
    if invocation.plan.kind is ToolKind.command:
        command = invocation.plan.command
        if command is None:
            return rejected(invocation, limits, "no command to run (the plan has none)")
        # the checked structure itself: the runner executes it, no shell is involved
        # a caller that feeds its stdin (sandboxd.backends.stdin): a pipe, not /dev/null
        return replace(base, kind="plan", plan=command,
                       stdin=call_stdin.requested() is not None)
    if invocation.plan.kind in KERNEL_KINDS:
        code = invocation.arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return rejected(invocation, limits, "argument 'code' must be non-empty")
        if len(code.encode()) > MAX_CODE_BYTES:
            return rejected(invocation, limits, "the code is too large")
        if invocation.plan.kind is ToolKind.bash:  # its kernel may execute these only
            return replace(base, kind="bash", code=code, programs=invocation.plan.programs)
        # python's imports, javascript's modules: the kernel's own check of the rule
        return replace(base, kind=KERNEL_REQUESTS[invocation.plan.kind], code=code,
                       imports_allow=invocation.plan.imports_allow,
                       imports_deny=invocation.plan.imports_deny)
    return rejected(invocation, limits,
                    f"the container backend does not run {invocation.plan.kind} tools")


def rejected(invocation: Invocation, limits: Limits, message: str) -> Result:
    """A call the backend refuses before any container is involved."""
    return Result.build(invocation, BACKEND, Reason.policy, status=Status.rejected,
                        limits=limits, cleanup=Cleanup(verified=True), message=message)


async def exchange(box: Box, request: WorkerRequest, limits: Limits,
                   deadline: float, events: EventSink | None = None,
                   interrupt: Interrupt | None = None) -> Outcome:
    """Run one request on ``box`` within the deadline (raises TimeoutError); ``events``: a
    streaming caller's sink. With ``interrupt`` (a kernel call), the deadline, a request and
    a cancel interrupt the call first (see :class:`Interrupt`): the outcome is then the
    runner's answer to the interrupt (``interrupt.reason`` says why), TimeoutError or
    :class:`CancelledAfterInterrupt` when it did not answer within the grace.

    The deadline is enforced with ``asyncio.wait`` around a task, never with nested
    ``wait_for``/``timeout`` (Python 3.11's ``wait_for`` can swallow a cancellation that
    races with completion, which would let a call outlive its deadline).
    """
    out = CallOutput(displays=DisplayCollector(request.display),
                     events=events, stdin=call_stdin.requested() if request.stdin else None)
    if deadline - time.monotonic() <= 0:
        raise TimeoutError
    task = asyncio.ensure_future(_exchange_body(box, request, limits, out))
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


async def _exchange_body(box: Box, request: WorkerRequest, limits: Limits,
                         out: CallOutput) -> Outcome:
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
        await endpoint.channel.call(request, limits.output_bytes, out)
    except RunnerLost as exc:
        return Outcome(out, str(exc))
    return Outcome(out, None)


def timeout_result(invocation: Invocation, limits: Limits, started: float,
                   verified: bool, detail: str) -> Result:
    """The result of a call that ran past its wall deadline."""
    return Result.build(invocation, BACKEND, Reason.wall_timeout, limits=limits,
                        started=started, cleanup=Cleanup(verified=verified, detail=detail))


def build_result(invocation: Invocation, limits: Limits, outcome: Outcome, started: float,
                 verified: bool, *, oom: bool, detail: str | None,
                 engine_error: str | None, interrupted: Reason | None = None) -> Result:
    """The result of a call that reached its runner (``engine_error``: why the engine was
    last seen failing, if it was; ``interrupted``: the call was interrupted at its deadline
    or on a cancel, which is its termination unless it hit a limit)."""
    out, rec = outcome.output, outcome.record
    exit_code = rec.exit_code
    sig = rec.signal
    message = None
    if outcome.superseded:
        reason = Reason.cancelled
        message = ("the session's container was removed while this call ran, because "
                   "another call of the session hit a limit; run it again")
    elif rec.oom or oom:
        reason = Reason.memory_limit  # the message: the one table (Result.build)
    elif out.over_limit or rec.output_limit:
        reason = Reason.output_limit
    elif rec.pids_limit:
        reason = Reason.pids_limit
    elif interrupted is not None:
        reason = interrupted
        why = rec.not_idle or rec.error or outcome.lost
        if why:
            message = (f"{LIMIT_MESSAGES[reason].format(**limits.to_wire())}; "
                       f"{str(why).rstrip('.')}")
    elif outcome.lost:
        reason = Reason.exited
        message = outcome.lost
        if engine_error is not None:
            message = f"the Docker engine went away during the call ({outcome.lost})"
    elif rec.error:
        reason = Reason.exited
        message = rec.error
    else:
        reason = Reason.exited
        if exit_code != 0 and rec.message is not None:
            message = rec.message  # the exception line, as the restricted backend's
    status = status_for(reason, exit_code)
    if (outcome.lost or rec.error) and not outcome.superseded and reason is not interrupted:
        status = Status.error
    truncated = Truncated()
    if reason is Reason.output_limit:
        truncated = Truncated(stdout=out.last_stream == "stdout",
                              stderr=out.last_stream == "stderr")
    return Result.build(
        invocation, BACKEND, reason, status=status, exit_code=exit_code, signal=sig,
        stdout=out.stdout.decode("utf-8", errors="replace"),
        stderr=out.stderr.decode("utf-8", errors="replace"),
        truncated=truncated,
        value=rec.value if rec.has_value else None,
        value_repr=rec.value_repr if rec.has_value else None,
        resources=Resources(wall_ms=int((time.monotonic() - started) * 1000),
                            cpu_ms=rec.cpu_ms, peak_memory_bytes=rec.peak_memory_bytes),
        limits=limits,
        cleanup=Cleanup(verified=verified, detail=detail),
        message=message,
        outputs=list(out.displays.items),
    )
