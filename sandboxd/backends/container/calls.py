"""One call on one container: the request sent to its runner, the exchange under the wall
deadline, and the :class:`~sandboxd.models.Result` built from what came back."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from sandboxd.backends.container import engine
from sandboxd.backends.container.boxes import Box
from sandboxd.backends.container.runner import CallOutput, RunnerLost
from sandboxd.deadline import within
from sandboxd.display import DisplayCaps
from sandboxd.models import (
    Cleanup,
    Invocation,
    Limits,
    Plan,
    Reason,
    Resources,
    Result,
    Status,
    ToolKind,
    Truncated,
    status_for,
)
from sandboxd.outputs import DisplayCollector
from sandboxd.streaming import EventSink

BACKEND = "container"
MAX_CODE_BYTES = 4 * 1024 * 1024
RUNNER_CONNECT_S = 15.0  # a started container's runner connects well within this


@dataclass
class Outcome:
    """What one exchange with a runner gave: its output and exit record, or why it was lost."""

    output: CallOutput
    lost: str | None
    superseded: bool = False

    @property
    def record(self) -> dict[str, Any]:
        """The runner's exit record (empty when there was none)."""
        return self.output.exit or {}

    @property
    def clean(self) -> bool:
        """The call ended by itself, within every limit: its container may be reused."""
        rec = self.record
        return (self.output.exit is not None and not self.lost and not self.superseded
                and not self.output.over_limit
                and not rec.get("oom") and not rec.get("pids_limit")
                and not rec.get("output_limit") and not rec.get("error"))

    @property
    def needs_oom_check(self) -> bool:
        """Ask the engine about OOM when the process died by SIGKILL or the runner vanished."""
        rec = self.record
        return not rec.get("oom") and (self.lost is not None or rec.get("signal") == 9)


def request_for(invocation: Invocation, limits: Limits) -> dict[str, Any] | Result:
    """The runner request of a call, or the result that rejects it."""
    env = {"PATH": engine.CHILD_PATH, "HOME": "/workspace", "LANG": "C.UTF-8",
           "TMPDIR": "/tmp", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
           # matplotlib (the datascience image): no display, and its config and font cache
           # in the writable /tmp, not in the workspace or the read-only root
           "MPLBACKEND": "Agg", "MPLCONFIGDIR": "/tmp/matplotlib"}
    base = {"id": invocation.id, "env": env, "cwd": "/workspace",
            "output_bytes": limits.output_bytes,
            "display": DisplayCaps(invocation.display_bytes, invocation.displays).wire()}
    if invocation.kind is ToolKind.command:
        plan = invocation.plan
        if plan is None:
            if not invocation.argv:
                return rejected(invocation, limits, "no command to run (empty argv)")
            plan = Plan.single([str(a) for a in invocation.argv])
        # the checked structure itself: the runner executes it, no shell is involved
        return {**base, "kind": "plan", "plan": plan.model_dump(mode="json")}
    if invocation.kind is ToolKind.python:
        code = invocation.arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return rejected(invocation, limits, "argument 'code' must be non-empty")
        if len(code.encode()) > MAX_CODE_BYTES:
            return rejected(invocation, limits, "the code is too large")
        return {**base, "kind": "python", "code": code,
                "imports_allow": list(invocation.imports_allow),
                "imports_deny": list(invocation.imports_deny)}
    return rejected(invocation, limits,
                    f"the container backend does not run {invocation.kind} tools")


def rejected(invocation: Invocation, limits: Limits, message: str) -> Result:
    """A call the backend refuses before any container is involved."""
    return Result.build(invocation, BACKEND, Reason.policy, status=Status.rejected,
                        limits=limits, cleanup=Cleanup(verified=True), message=message)


async def exchange(box: Box, request: dict[str, Any], limits: Limits,
                   deadline: float, events: EventSink | None = None) -> Outcome:
    """Run one request on ``box`` within the deadline (raises TimeoutError); ``events``: a
    streaming caller's sink.

    The deadline is enforced with ``asyncio.wait`` around a task, never with nested
    ``wait_for``/``timeout`` (Python 3.11's ``wait_for`` can swallow a cancellation that
    races with completion, which would let a call outlive its deadline).
    """
    out = CallOutput(displays=DisplayCollector(DisplayCaps(**request["display"])),
                     events=events)
    if deadline - time.monotonic() <= 0:
        raise TimeoutError
    task = asyncio.ensure_future(_exchange_body(box, request, limits, out))
    finished, result = await within(task, deadline - time.monotonic())
    if not finished:
        raise TimeoutError
    return result


async def _exchange_body(box: Box, request: dict[str, Any], limits: Limits,
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
                 engine_error: str | None) -> Result:
    """The result of a call that reached its runner (``engine_error``: why the engine was
    last seen failing, if it was)."""
    out, rec = outcome.output, outcome.record
    exit_code = rec.get("exit_code")
    sig = rec.get("signal")
    message = None
    if outcome.superseded:
        reason = Reason.cancelled
        message = ("the session's container was removed while this call ran, because "
                   "another call of the session hit a limit; run it again")
    elif rec.get("oom") or oom:
        reason = Reason.memory_limit  # the message: the one table (Result.build)
    elif out.over_limit or rec.get("output_limit"):
        reason = Reason.output_limit
    elif rec.get("pids_limit"):
        reason = Reason.pids_limit
    elif outcome.lost:
        reason = Reason.exited
        message = outcome.lost
        if engine_error is not None:
            message = f"the Docker engine went away during the call ({outcome.lost})"
    elif rec.get("error"):
        reason = Reason.exited
        message = str(rec["error"])
    else:
        reason = Reason.exited
    status = status_for(reason, exit_code)
    if (outcome.lost or rec.get("error")) and not outcome.superseded:
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
        value=rec.get("value") if rec.get("has_value") else None,
        resources=Resources(wall_ms=int((time.monotonic() - started) * 1000),
                            cpu_ms=int(rec.get("cpu_ms") or 0),
                            peak_memory_bytes=int(rec.get("peak_memory_bytes") or 0)),
        limits=limits,
        cleanup=Cleanup(verified=verified, detail=detail),
        message=message,
        outputs=list(out.displays.items),
    )
