"""The outcome of a call: what the worker reported and how it exited, turned into a
:class:`sandboxd.models.Result` (through ``Result.build``), and the proof that the worker is
gone (``cleanup.verified``). The mapping is described in :mod:`.backend`.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import Any

from sandboxd.backends.call import BackendCall
from sandboxd.backends.restricted import health
from sandboxd.backends.restricted.frames import FrameReader
from sandboxd.backends.restricted.worker_call import Exchange, WorkerCall
from sandboxd.backends.restricted.zygote_client import StandbyWorker
from sandboxd.host import procinfo
from sandboxd.models import Cleanup, Reason, Resources, Result, Status, Truncated
from sandboxd.protocol.call import WorkerReport
from sandboxd.protocol.rules import OutputBudget

#: the backend's name in results
BACKEND_NAME = "restricted"

#: the limits a worker reports, by its outcome (the limit's name); any other outcome: it
#: exited, ``ok`` or ``error`` with its exit code and value. A kernel reports ``cpu_limit``
#: from its SIGXCPU handler (see worker.cpu_exceeded).
_REPORTED_LIMITS = {limit.value: limit
                    for limit in (Reason.memory_limit, Reason.cpu_limit, Reason.output_limit)}
#: the reasons whose result keeps the worker's or the daemon's message; any other limit is
#: told in the words of the one table (Result.build). A memory limit keeps the worker's
#: explanation when it has one (a limit it cannot start in).
_KEEPS_MESSAGE = frozenset({Reason.exited, Reason.memory_limit})
#: the CPU time short of the limit at which a worker killed by SIGKILL counts as having hit it
_CPU_SLACK_S = 0.2


@dataclass(frozen=True)
class _Verdict:
    """How a call ended: its reason, and what the result says besides."""

    reason: Reason
    exit_code: int | None = None
    value: Any = None
    message: str | None = None


@dataclass(frozen=True)
class _Output:
    """The call's output within its cap (stdout and stderr together)."""

    stdout: str
    stderr: str
    truncated: Truncated


def result(call: BackendCall | WorkerCall, status: Status | None, reason: Reason,
           **kw: Any) -> Result:
    """``Result.build`` for this backend, under the call's limits (a worker call's are its
    request's)."""
    return Result.build(call.invocation, BACKEND_NAME, reason, limits=call.limits,
                        status=status, **kw)


def build_result(wc: WorkerCall, seen: Exchange, worker: StandbyWorker, zygote_pid: int,
                 cleanup: Cleanup | None = None) -> Result:
    """The call's :class:`Result` from the worker's report (if any), its exit report from the
    zygote and what the daemon saw (deadline, overflow, protocol violation, crash), with the
    display items the daemon accepted (whatever the outcome: they were shown as they came).
    ``cleanup``: the proof when the caller has it (a session kernel kept alive on purpose),
    else it is established here (:func:`verify_gone`)."""
    info = seen.exit_info or {}
    resources = Resources(
        wall_ms=int((time.monotonic() - wc.started) * 1000),
        cpu_ms=int(info.get("cpu_ms", 0)),
        peak_memory_bytes=int(info.get("peak_memory") or info.get("maxrss") or 0),
    )
    if cleanup is None:
        verified, detail = verify_gone(worker.pid, worker.cgroup, info, zygote_pid)
        cleanup = Cleanup(verified=verified, detail=detail)
    res = _build_result(wc, seen, info, resources, cleanup)
    res.outputs = list(seen.reader.displays.items)
    report = seen.reader.report
    if res.value is not None and report is not None and report.value_repr is not None:
        res.value_repr = report.value_repr
    return res


def _build_result(wc: WorkerCall, seen: Exchange, info: dict[str, Any], resources: Resources,
                  cleanup: Cleanup) -> Result:
    """The result itself: a daemon-side failure, a failed set-up, or the call's verdict."""
    reader, report = seen.reader, seen.reader.report
    out = _output(reader, wc.limits.output_bytes)
    if seen.crashed is not None:
        return result(wc, Status.error, Reason.exited, stdout=out.stdout,
                      stderr=out.stderr, truncated=out.truncated, resources=resources,
                      cleanup=cleanup, message=f"sandbox worker failed: {seen.crashed}")
    if seen.reason is None and report is not None and report.outcome == "setup_error":
        return result(wc, Status.error, Reason.exited, exit_code=info.get("exit_code"),
                      resources=resources, cleanup=cleanup,
                      message=f"sandbox set-up failed: {report.message}")
    verdict = _verdict(seen.reason, report, info, resources.cpu_ms,
                       wc.request.restricted.cpu_seconds)
    if verdict.reason is Reason.output_limit:
        _mark_cut(out.truncated, reader, wc.limits.output_bytes, by_worker=seen.reason is None)
    return result(
        wc, None, verdict.reason, exit_code=verdict.exit_code, signal=info.get("signal"),
        stdout=out.stdout, stderr=out.stderr, truncated=out.truncated, value=verdict.value,
        resources=resources, cleanup=cleanup,
        message=verdict.message if verdict.reason in _KEEPS_MESSAGE else None)


def _output(reader: FrameReader, cap: int) -> _Output:
    """stdout then stderr within ``cap`` bytes together (sandboxd.protocol.rules), decoded,
    and which of them was cut (here, or by the worker for stdout)."""
    budget = OutputBudget(cap)
    out = bytes(reader.stdout[: budget.take(len(reader.stdout))])
    err = bytes(reader.stderr[: budget.take(len(reader.stderr))])
    report = reader.report
    truncated = Truncated(
        stdout=len(out) < len(reader.stdout) or bool(report and report.truncated_stdout),
        stderr=len(err) < len(reader.stderr),
    )
    return _Output(out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), truncated)


def _mark_cut(truncated: Truncated, reader: FrameReader, cap: int, *, by_worker: bool) -> None:
    """An output limit cut the output: when the worker reported it without cutting stdout,
    the cap cut its own stderr (a traceback); stdout is cut when the output filled the cap."""
    if by_worker and not truncated.stdout:
        truncated.stderr = True
    truncated.stdout = truncated.stdout or len(reader.stdout) + len(reader.stderr) >= cap


def _verdict(daemon_reason: Reason | None, report: WorkerReport | None, info: dict[str, Any],
             cpu_ms: int, cpu_seconds: float) -> _Verdict:
    """A limit the daemon enforced, else the worker's own report when it exited by itself,
    else what its exit says (it was killed, or exited without a report)."""
    if daemon_reason is not None:
        return _Verdict(daemon_reason, info.get("exit_code"))
    if report is not None and info.get("signal") is None:
        return _reported(report, info.get("exit_code"))
    return _unreported(info, cpu_ms, cpu_seconds)


def _reported(report: WorkerReport, exit_code: int | None) -> _Verdict:
    """The worker's word: a limit it met, else it exited (``ok`` or ``error``)."""
    message = report.message if report.outcome != "ok" else None
    limit = _REPORTED_LIMITS.get(report.outcome or "")
    if limit is not None:
        return _Verdict(limit, exit_code, message=message)
    return _Verdict(Reason.exited, report.exit_code or 0, report.value, message)


def _unreported(info: dict[str, Any], cpu_ms: int, cpu_seconds: float) -> _Verdict:
    """A worker without a report: the cgroup OOM killer, RLIMIT_CPU (``SIGXCPU``, or
    ``SIGKILL`` with its CPU time at the limit), else a crash."""
    exit_code: int | None = info.get("exit_code")
    sig: int | None = info.get("signal")
    if info.get("oom"):
        return _Verdict(Reason.memory_limit, exit_code)
    if sig == signal.SIGXCPU or (
        sig == signal.SIGKILL and cpu_ms >= (cpu_seconds - _CPU_SLACK_S) * 1000
    ):
        return _Verdict(Reason.cpu_limit, exit_code)
    if sig is not None:
        return _Verdict(Reason.exited, exit_code if exit_code is not None else 128 + sig,
                        message=f"the worker was killed by signal {sig}")
    return _Verdict(Reason.exited, exit_code if exit_code is not None else 128,
                    message="the worker exited without a report")

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
        if pid is not None:  # with the zygote's exit report it was reaped
            problems.extend(_still_there(pid, zygote_pid))
    elif not info.get("cgroup_empty", True):
        problems.append("processes left in the worker's cgroup")
    return (not problems), ("; ".join(problems) or None)


def _still_there(pid: int, zygote_pid: int) -> list[str]:
    """What shows the worker ``pid`` may not be gone: a live process with its pid that is
    still the zygote's child (or init's), or one the zygote did not reap."""
    try:
        seen = procinfo.parent_and_state(pid)  # one read of /proc/<pid>/stat
    except (OSError, ValueError, IndexError) as exc:
        return [f"/proc/{pid}/stat: {exc}"]
    if seen is None:
        return []
    ppid, state = seen
    if ppid in (zygote_pid, 1) and state != "Z":
        return [f"worker {pid} still running"]
    if ppid == zygote_pid:
        return [f"worker {pid} not reaped"]
    return []
