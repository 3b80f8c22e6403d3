"""The outcome of a call: what the worker reported and how it exited, turned into a
:class:`sandboxd.models.Result` (through ``Result.build``), and the proof that the worker is
gone (``cleanup.verified``). The mapping is described in :mod:`.backend`.
"""

from __future__ import annotations

import signal
import time
from typing import Any

from sandboxd.backends.restricted import health
from sandboxd.backends.restricted.frames import FrameReader
from sandboxd.backends.restricted.zygote_client import StandbyWorker
from sandboxd.host import procinfo
from sandboxd.models import (
    Cleanup,
    Invocation,
    Limits,
    Reason,
    Resources,
    Result,
    Status,
    Truncated,
)
from sandboxd.protocol.call import WorkerRequest
from sandboxd.protocol.rules import OutputBudget

#: the backend's name in results
BACKEND_NAME = "restricted"


def result(
    inv: Invocation, limits: Limits, status: Status | None, reason: Reason, **kw: Any
) -> Result:
    """``Result.build`` for this backend."""
    return Result.build(inv, BACKEND_NAME, reason, limits=limits, status=status, **kw)


def build_result(
    inv: Invocation,
    limits: Limits,
    msg: WorkerRequest,
    reader: FrameReader,
    reason: Reason | None,
    exit_info: dict[str, Any] | None,
    call: StandbyWorker,
    crashed: str | None,
    started_at: float,
    zygote_pid: int,
    cleanup: Cleanup | None = None,
) -> Result:
    """The call's :class:`Result` from the worker's report (if any), its exit report from the
    zygote and what the daemon saw (deadline, overflow, protocol violation, crash), with the
    display items the daemon accepted (whatever the outcome: they were shown as they came).
    ``cleanup``: the proof when the caller has it (a session kernel kept alive on purpose),
    else it is established here (:func:`verify_gone`)."""
    res = _build_result(inv, limits, msg, reader, reason, exit_info, call, crashed, started_at,
                        zygote_pid, cleanup)
    res.outputs = list(reader.displays.items)
    report = reader.report
    if res.value is not None and report is not None and report.value_repr is not None:
        res.value_repr = report.value_repr
    return res


def _build_result(
    inv: Invocation,
    limits: Limits,
    msg: WorkerRequest,
    reader: FrameReader,
    reason: Reason | None,
    exit_info: dict[str, Any] | None,
    call: StandbyWorker,
    crashed: str | None,
    started_at: float,
    zygote_pid: int,
    cleanup: Cleanup | None = None,
) -> Result:
    cap = limits.output_bytes
    budget = OutputBudget(cap)  # stdout and stderr together (sandboxd.protocol.rules)
    out = bytes(reader.stdout[: budget.take(len(reader.stdout))])
    err = bytes(reader.stderr[: budget.take(len(reader.stderr))])
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    report = reader.report
    truncated = Truncated(
        stdout=len(out) < len(reader.stdout)
        or bool(report and report.truncated_stdout),
        stderr=len(err) < len(reader.stderr),
    )
    info = exit_info or {}
    resources = Resources(
        wall_ms=int((time.monotonic() - started_at) * 1000),
        cpu_ms=int(info.get("cpu_ms", 0)),
        peak_memory_bytes=int(info.get("peak_memory") or info.get("maxrss") or 0),
    )
    if cleanup is None:
        verified, detail = verify_gone(call.pid, call.cgroup, info, zygote_pid)
        cleanup = Cleanup(verified=verified, detail=detail)
    exit_code: int | None = info.get("exit_code")
    sig: int | None = info.get("signal")
    value: Any = None
    message: str | None = None
    if crashed is not None:
        return result(
            inv,
            limits,
            Status.error,
            Reason.exited,
            stdout=stdout,
            stderr=stderr,
            truncated=truncated,
            resources=resources,
            cleanup=cleanup,
            message=f"sandbox worker failed: {crashed}",
        )
    if reason is None and report is not None and report.outcome == "setup_error":
        return result(
            inv,
            limits,
            Status.error,
            Reason.exited,
            exit_code=exit_code,
            resources=resources,
            cleanup=cleanup,
            message=f"sandbox set-up failed: {report.message}",
        )
    if reason is None and report is not None and sig is None:
        outcome = report.outcome
        if outcome == "memory_limit":
            reason = Reason.memory_limit
        elif outcome == "cpu_limit":  # a kernel's SIGXCPU handler (see worker.cpu_exceeded)
            reason = Reason.cpu_limit
        elif outcome == "output_limit":
            reason = Reason.output_limit
            if not truncated.stdout:  # the cap cut the worker's own stderr (a traceback)
                truncated.stderr = True
        else:
            reason = Reason.exited
            exit_code = report.exit_code or 0
            value = report.value
        message = report.message if outcome != "ok" else None
    elif reason is None:
        if info.get("oom"):
            reason = Reason.memory_limit
        elif sig == signal.SIGXCPU or (
            sig == signal.SIGKILL and resources.cpu_ms >= (msg.cpu_seconds - 0.2) * 1000
        ):
            reason = Reason.cpu_limit
        else:
            reason = Reason.exited
            message = (
                f"the worker was killed by signal {sig}"
                if sig is not None
                else "the worker exited without a report"
            )
            exit_code = exit_code if exit_code is not None else (128 + (sig or 0))
    if reason is Reason.output_limit:
        truncated.stdout = truncated.stdout or len(reader.stdout) + len(reader.stderr) >= cap
    if reason is not Reason.exited and reason is not Reason.memory_limit:
        message = None  # a limit: the words of the one table (Result.build); a memory
        # limit keeps the worker's explanation when it has one (a limit it cannot start in)
    return result(
        inv,
        limits,
        None,
        reason,
        exit_code=exit_code,
        signal=sig,
        stdout=stdout,
        stderr=stderr,
        truncated=truncated,
        value=value,
        resources=resources,
        cleanup=cleanup,
        message=message,
    )

def verify_gone(
    pid: int | None, cgroup: str | None, info: dict[str, Any], zygote_pid: int
) -> tuple[bool, str | None]:
    """Prove the worker is gone: reaped by the zygote, no live process with its pid that is
    still our child, and no cgroup directory left (or, without the zygote's report, killed
    and its cgroup removed by the daemon itself)."""
    if info.get("daemon_verified"):
        return health.verify_ourselves(info)
    problems = []
    if not info:
        problems.append("no exit report from the zygote")
    if pid is not None and not info:  # with the zygote's exit report it was reaped
        try:
            seen = procinfo.parent_and_state(pid)  # one read of /proc/<pid>/stat
        except (OSError, ValueError, IndexError) as exc:
            seen = None
            problems.append(f"/proc/{pid}/stat: {exc}")
        if seen is not None:
            ppid, state = seen
            if ppid in (zygote_pid, 1) and state != "Z":
                problems.append(f"worker {pid} still running")
            elif ppid == zygote_pid:
                problems.append(f"worker {pid} not reaped")
    if info and not info.get("cgroup_empty", True):
        problems.append("processes left in the worker's cgroup")
    return (not problems), ("; ".join(problems) or None)
