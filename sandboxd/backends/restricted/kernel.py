"""Session kernels of the restricted backend: persistent Python per session.

A ``python`` call that names a session runs in that session's kernel: a standby worker taken
from the zygote like any other, confined for the session's first call exactly as a one-shot
worker (chroot into the session workspace, the session uid, no_new_privs, seccomp, Landlock,
rlimits, its own cgroup), whose request says ``"kernel": true``. After its report it does not
exit: it waits, confined as it is, for the session's next request and runs it in the same
namespace (:func:`.lang.run_user_code` with ``namespace``: compiled restricted, the same
guards, the trusted globals set again every call). The zygote only forked it: nothing a
kernel does reaches the zygote or another kernel.

* **Order:** one call at a time per session, in order (a lock per session).
* **Limits:** memory and pids are the session's - the kernel's cgroup and RLIMIT_AS, set by
  its first call, hold for its whole life (the results of later calls show these limits).
  Wall time is per call: the daemon kills the kernel at the call's deadline. CPU time is
  per call too, through RLIMIT_CPU, whose hard limit a kernel starts without: before each
  later call, trusted worker code moves the kernel's soft limit to the CPU it has used so far
  plus the call's allowance, and the daemon sets soft and hard (one second above: SIGKILL)
  from outside with ``prlimit`` when it may (CAP_SYS_RESOURCE, or the same uid; the systemd
  unit does not grant it). Where it may not, the soft limit alone holds: its SIGXCPU ends
  the call with ``cpu_limit`` through a handler (a kernel that is PID 1 of its namespace
  would ignore the default action); a kernel that escaped the language layer could raise
  its own soft limit, and the call's wall deadline still ends it - the allowance (the
  timeout plus a second) never falls short of it, a single-threaded kernel's CPU time being
  at most its wall time.
  ``resources.cpu_ms`` is the call's share (``/proc/<pid>/stat``), ``peak_memory_bytes`` the
  kernel cgroup's peak.
* **Loss:** a call that does not end ``ok``/``error`` with a valid report - a deadline, a
  limit (CPU, memory, output), a protocol violation, a crash - ends the kernel: it is killed,
  its exit report awaited and its cleanup verified (process reaped, cgroup removed) exactly as
  for a one-shot worker, and the result says ``kernel.lost`` with the termination reason. The
  next call starts a fresh kernel (``kernel.fresh``, an empty namespace) in the same
  workspace, whose files are untouched.
* **End:** :meth:`KernelPool.end` (a restart, the session closed or expired) and
  :meth:`KernelPool.close` (the backend closes) kill and verify the same way.

Every frame a kernel writes is read by a bounded :class:`.frames.FrameReader` that ends the
call at the report (``until_report``); the result is built by :func:`.outcome.build_result`
as for one-shot calls.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import os
import resource
import signal
import time
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sandboxd.backends.base import CancelledAfterCleanup
from sandboxd.backends.call import BackendCall
from sandboxd.backends.kernel_verdict import Ended, Observed, kernel_verdict
from sandboxd.backends.restricted import health, idle, outcome, standby
from sandboxd.backends.restricted.deaths import Deaths
from sandboxd.backends.restricted.frames import FrameReader
from sandboxd.backends.restricted.hibernation import Hibernation, Snapshot, Woken
from sandboxd.backends.restricted.worker_call import Exchange, WorkerCall
from sandboxd.backends.restricted.zygote_client import StandbyWorker, ZygoteDied, ZygoteHandle
from sandboxd.backends.restricted.zygote_protocol import cgroup_limits
from sandboxd.host.procinfo import pidfd_dead
from sandboxd.models import Cleanup, Invocation, Kernel, Limits, Reason, Result, Status
from sandboxd.protocol.call import KERNEL_SURVIVES, WorkerReport, WorkerRequest
from sandboxd.util.deadline import within

if TYPE_CHECKING:
    from sandboxd.backends.restricted.backend import RestrictedBackend

log = logging.getLogger("sandboxd.restricted")

_TICKS = os.sysconf("SC_CLK_TCK")
#: how many closed sessions are remembered (a call queued behind a close waits seconds at most)
CLOSED_MEMORY = 4096


def cpu_seconds_used(pid: int, uid: int | None = None) -> float:
    """User + system CPU seconds of process ``pid`` (a kernel of sandbox uid ``uid``) so far
    (``/proc/<pid>/stat``, read as :func:`.idle.read_proc` reads)."""
    stat = idle.read_proc(pid, "stat", uid)
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


@dataclass(eq=False)
class _Run:
    """What one kernel call saw so far (filled in as it runs), for its result."""

    #: the request as sent (its CPU limit moved for a kernel's later call)
    msg: WorkerRequest
    reason: Reason | None = None
    crashed: str | None = None
    exit_info: dict[str, Any] | None = None
    interrupted: bool = False
    lost: bool = True
    #: a fork's first call: its parent's pickled state, sent after the request
    state: bytes = b""


@dataclass(eq=False)
class SessionKernel:
    """A live kernel: its zygote, worker (socket, pidfd, cgroup) and what it was started for."""

    zygote: ZygoteHandle
    worker: StandbyWorker
    workspace: str
    uid: int | None
    #: the session's limits: memory, CPU share and pids of its first call (its cgroup)
    limits: Limits
    calls: int = 0
    #: why it is being ended from outside (restart, session closed), for an in-flight call
    ended: str | None = None
    cpu_s: float = 0.0
    #: a call runs in it now
    busy: bool = False
    #: the imports rule of its last call (a snapshot pickles under it)
    imports: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    #: set when the call in flight ends (its reader stopped) or an interrupt is asked for
    #: it (``POST .../interrupt``): the call waits on this one event
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: when its last call ended (``time.monotonic()``; see :mod:`.hibernation`)
    idle_since: float = field(default_factory=time.monotonic)
    #: ``calls`` when its state was last found not to hibernate whole (-1: never)
    unpicklable_at: int = -1

    @property
    def alive(self) -> bool:
        """The process is running and its zygote is alive (a pidfd is readable once dead)."""
        if self.ended or not self.zygote.alive or self.worker.exited.done():
            return False
        pidfd = self.worker.pidfd
        if pidfd is None:
            return True
        return not pidfd_dead(pidfd)


class KernelPool:
    """The restricted backend's session kernels."""

    def __init__(self, backend: RestrictedBackend, snapshot: Snapshot) -> None:
        self.backend = backend
        self.kernels: dict[str, SessionKernel] = {}
        self.locks: dict[str, asyncio.Lock] = {}
        #: sessions closed lately (calls of theirs still queued must not start a kernel)
        self.closed: collections.OrderedDict[str, None] = collections.OrderedDict()
        #: whether the daemon may set a kernel's CPU limits from outside (see the docs)
        self.outside_cpu_limit = True
        #: forks' sessions whose first kernel restores their parent's state (see .carry)
        self.pending: dict[str, bytes] = {}
        #: the kernels :meth:`live` counts without a look at each (not ended, no exit seen
        #: on their pidfd), those it must look at (no pidfd), and the zygotes they came from
        self.running: set[str] = set()
        self.unwatched: set[str] = set()
        self.zygotes: set[ZygoteHandle] = set()
        self.deaths = Deaths()
        config = backend.config
        #: the idle kernels asleep on disk (see .hibernation)
        self.hibernation = Hibernation(self, config.state_dir / "hibernated",
                                       config.kernel_hibernate_after_s, config.fork_state_bytes,
                                       snapshot)

    def seed(self, sid: str, state: bytes) -> None:
        """The session's next fresh kernel restores ``state`` (its parent's, pickled in the
        parent's sandbox) before its first call; a restart or close drops it."""
        self.pending[sid] = state

    def live(self) -> AbstractSet[str]:
        """Sessions whose kernel is alive (:attr:`SessionKernel.alive` of each): the running
        ones less those whose pidfd says they exited (one ``epoll_wait``), unless a kernel
        has no pidfd or a zygote died (then each is looked at). The running set itself, not
        a copy (read it, never change it): this is asked on every call."""
        self.running.difference_update(self.deaths.died())
        if self.unwatched or not all(z.alive for z in self.zygotes):
            self.zygotes = {k.zygote for k in self.kernels.values()}
            return {sid for sid, k in self.kernels.items() if k.alive}
        return self.running

    def _started(self, sid: str, k: SessionKernel) -> None:
        """``k`` is the session's kernel from now on (see :meth:`live`)."""
        self.kernels[sid] = k
        self.zygotes.add(k.zygote)
        self.running.add(sid)
        if k.worker.pidfd is None:
            self.unwatched.add(sid)
        else:
            self.deaths.watch(k.worker.pidfd, sid)

    def _ending(self, sid: str, k: SessionKernel, why: str) -> None:
        """``k`` is being ended from outside (:attr:`SessionKernel.ended`)."""
        k.ended = k.ended or why
        if self.kernels.get(sid) is k:
            self.running.discard(sid)

    async def run(self, call: BackendCall, code: str) -> Result:
        """Run ``code`` in the kernel of the call's session (started when it has none)."""
        inv, limits, deadline = call.invocation, call.limits, call.deadline
        sid = inv.session
        assert sid is not None
        lock = self.locks.setdefault(sid, asyncio.Lock())
        async with lock:
            if sid in self.closed:
                result = outcome.result(call, Status.error, Reason.exited,
                                        cleanup=Cleanup(verified=True),
                                        message="the session was closed")
                result.kernel = Kernel(lost=True, reason="the session was closed")
                return result
            k = self.kernels.get(sid)
            if k is not None and (not k.alive or k.workspace != str(inv.workspace)
                                  or k.uid != inv.uid):
                await self._stop(sid, k, "replaced")  # died between calls (its zygote died)
                k = None
            asleep = self.hibernation.asleep.get(sid) if k is None else None
            if asleep is not None and (asleep.workspace != str(inv.workspace)
                                       or asleep.uid != inv.uid):
                self.hibernation.drop(sid)
                asleep = None
            if time.monotonic() >= deadline:  # it waited for the session's previous calls
                result = outcome.result(
                    call, Status.timeout, Reason.wall_timeout,
                    cleanup=Cleanup(verified=True),
                    message="the call's time ran out while it waited for the session's "
                            "previous call; it did not run (the session's state is kept)")
                result.kernel = Kernel(calls=k.calls if k is not None else
                                       asleep.calls if asleep is not None else 0)
                return result
            kept = k.limits if k is not None else asleep.limits if asleep is not None else None
            if kept is not None:  # memory, CPU share, pids, rlimits: the kernel's (its first)
                limits = limits.kept_by_kernel(kept)
            wc = WorkerCall(call, replace(standby.request(call, code), limits=limits,
                                          kernel=True))
            if k is None:
                return await self._first(wc)
            return await self._call(k, wc, fresh=False)

    async def _first(self, wc: WorkerCall) -> Result:
        inv, limits, deadline, msg = wc.invocation, wc.limits, wc.deadline, wc.request
        assert inv.session is not None
        started_at = time.monotonic()
        read = await self.hibernation.read(inv.session)  # its state, if it sleeps
        try:
            z, worker = await self.backend.take_worker(deadline)
        except (ZygoteDied, TimeoutError) as exc:
            status, reason = ((Status.timeout, Reason.wall_timeout)
                              if isinstance(exc, TimeoutError) else (Status.error, Reason.exited))
            result = outcome.result(wc, status, reason, cleanup=Cleanup(verified=True),
                                    message=f"no sandbox worker: {exc}")
            result.kernel = (Kernel(fresh=True, calls=0, lost=True, reason=reason.value)
                             if read is None else Kernel(calls=read.asleep.calls))  # sleeps on
            return result
        z.took(worker, cgroup_limits(limits))
        k = SessionKernel(z, worker, str(inv.workspace), inv.uid, limits)
        self._started(inv.session, k)
        state = self.pending.pop(inv.session, b"")
        # (a sleeper leaves the asleep set as it joins the running one: never both)
        woken = None if state else self.hibernation.take(inv.session, read)
        if woken is not None and woken.state:  # it goes on: its calls are counted on
            k.calls, state = woken.asleep.calls, woken.state
        msg = replace(msg, state_bytes=len(state), woken=bool(state) and woken is not None)
        result = await self._call(k, replace(wc, request=msg), fresh=True,
                                  started_at=started_at, state=state, woken=woken)
        return result if woken is None else woken.tell(result)

    def _move_cpu_limit(self, k: SessionKernel, msg: WorkerRequest) -> WorkerRequest:
        """This call's CPU allowance on top of what the kernel used so far (see the module
        docs): the kernel moves its own soft limit (``cpu_call``); the daemon also sets soft
        and hard from outside when it may (CAP_SYS_RESOURCE, or the same uid).
        The request returned has ``cpu_seconds`` the absolute limit (for the outcome
        mapping)."""
        allowance = msg.restricted.cpu_seconds
        soft = math.ceil(k.cpu_s) + 1 + allowance
        msg = replace(msg, restricted=replace(msg.restricted, cpu_call=allowance,
                                              cpu_seconds=soft))
        if self.outside_cpu_limit:
            try:
                resource.prlimit(k.worker.pid, resource.RLIMIT_CPU, (soft, soft + 1))
            except PermissionError:
                self.outside_cpu_limit = False
                log.info("restricted: no CAP_SYS_RESOURCE: session kernels keep their CPU "
                         "limit themselves (the wall-clock deadline bounds every call)")
        return msg

    async def _call(self, k: SessionKernel, wc: WorkerCall, *, fresh: bool,
                    started_at: float | None = None, state: bytes = b"",
                    woken: Woken | None = None) -> Result:
        inv, limits, deadline, msg = wc.invocation, wc.limits, wc.deadline, wc.request
        started_at = time.monotonic() if started_at is None else started_at
        z, worker = k.zygote, k.worker
        run = _Run(msg, state=state)
        k.imports = (msg.imports_allow, msg.imports_deny)
        reader = FrameReader(asyncio.get_running_loop(), worker.sock.fileno(),
                             limits.output_bytes, limits.timeout_s, until_report=True,
                             display=msg.display, events=inv.events)
        z.in_use += 1
        k.calls += 1
        try:
            await self._exchange(k, inv, deadline, reader, run, fresh)
        except asyncio.CancelledError:
            raise await self._cancelled(k, inv, reader, fresh) from None
        except (ZygoteDied, OSError, TimeoutError, ValueError) as exc:
            run.crashed = f"{type(exc).__name__}: {exc}"
            run.exit_info = await asyncio.shield(standby.abort(z, worker, self.backend.layout))
        finally:
            z.in_use -= 1
            k.busy = False
            k.idle_since = time.monotonic()
            reader.close()
        if run.lost and k.ended and run.crashed is None and run.reason is None:
            run.crashed = f"the kernel was ended ({k.ended})"
        if woken is not None and woken.state:  # was its state restored? (its own word)
            if reader.report is not None and reader.report.restore_failed:
                k.calls, woken.lost = 1, "its saved state could not be restored"
            else:  # the session's kernel goes on
                fresh = False
        seen = Observed(Ended.FINISHED, fresh, k.calls, back=not run.lost,
                        interrupted=run.interrupted)
        if run.lost:
            result = self._result(wc, reader, run, k, started_at, None)
            await self._finish(inv.session, k, run.exit_info)
            why = result.termination.reason
            seen = replace(seen, stopped=k.ended, crashed=why is Reason.exited, termination=why)
            result.kernel = kernel_verdict(seen).kernel
            return result
        verdict = kernel_verdict(seen)
        result = self._result(wc, reader, run, k, started_at,
                              Cleanup(verified=True, detail=verdict.detail))
        result.kernel = verdict.kernel
        return result

    @staticmethod
    def _result(wc: WorkerCall, reader: FrameReader, run: _Run,
                k: SessionKernel, started_at: float, kept: Cleanup | None) -> Result:
        """The call's result (:func:`.outcome.build_result`, as for a one-shot call)."""
        wc = WorkerCall(replace(wc.call, started=started_at), run.msg)
        seen = Exchange(reader, run.reason, run.crashed, run.exit_info)
        return outcome.build_result(wc, seen, k.worker, k.zygote.pid, kept)

    async def _exchange(self, k: SessionKernel, inv: Invocation, deadline: float,
                        reader: FrameReader, run: _Run, fresh: bool) -> None:
        """Send the call, wait for its end (interrupt before kill at its deadline or on a
        request), then keep the kernel or end it; ``run`` is what it saw."""
        worker = k.worker
        if not fresh:
            k.cpu_s = cpu_seconds_used(worker.pid, k.uid)
            run.msg = self._move_cpu_limit(k, run.msg)
        k.wake.clear()
        reader.on_stop = k.wake.set
        k.busy = True
        await standby.send(asyncio.get_running_loop(), worker, run.msg)
        if run.state:
            await asyncio.get_running_loop().sock_sendall(worker.sock, run.state)
        finished, _ = await within(k.wake.wait(), deadline - time.monotonic())
        if not finished or not reader.done.is_set():
            # the deadline, or an interrupt request: interrupt before kill
            run.reason = Reason.wall_timeout if not finished else Reason.cancelled
            run.interrupted = await self._interrupt(k, reader)
        elif reader.violation is not None:
            run.crashed = f"it broke the result protocol ({reader.violation}) and was killed"
        elif reader.overflow:
            run.reason = Reason.output_limit
        report = reader.report
        if await self._survives(k, inv, deadline, report, run):
            self._keep(k, run, fresh)
            return
        if report is None or run.reason is not None or run.crashed is not None or k.ended:
            standby.kill_worker(k.zygote, worker)
        # else it reported a limit it caught itself (memory, output) and exits by
        # itself, as a one-shot worker does: its exit report is then the genuine one
        run.exit_info = await health.exit_report(k.zygote, worker)
        if run.exit_info is None:  # it lingers, or the zygote hangs: kill and reap it
            run.exit_info = await health.reap_ourselves(worker, self.backend.layout)

    @staticmethod
    async def _survives(k: SessionKernel, inv: Invocation, deadline: float,
                        report: WorkerReport | None, run: _Run) -> bool:
        """The kernel lives on: it came back from an interrupt, or it reported an end within
        every limit and is proven idle (its report is its own word)."""
        if run.interrupted:
            return True
        if (run.reason is not None or run.crashed is not None or report is None
                or report.outcome not in KERNEL_SURVIVES or k.ended):
            return False
        worker = k.worker
        busy = await idle.prove_idle(worker.pid, worker.fd, k.uid, deadline)
        if busy is None:
            return True
        log.warning("restricted: session %s kernel (pid %d) reported its end but %s; killed "
                    "at the call's deadline", inv.session, worker.pid, busy)
        run.reason = Reason.wall_timeout
        return False

    def _keep(self, k: SessionKernel, run: _Run, fresh: bool) -> None:
        """The kernel lives on: the call's share of its CPU time and its cgroup's peak."""
        layout = self.backend.layout
        used = cpu_seconds_used(k.worker.pid, k.uid)
        peak = layout.peak_memory(k.worker.cgroup) if layout.version else 0
        run.exit_info = {"cpu_ms": int((used - (0 if fresh else k.cpu_s)) * 1000),
                         "peak_memory": peak}
        k.cpu_s = used
        run.lost = False

    async def _cancelled(self, k: SessionKernel, inv: Invocation, reader: FrameReader,
                         fresh: bool) -> CancelledAfterCleanup:
        """A cancel interrupts first: a kernel that comes back is kept, else it is killed,
        reaped and verified gone."""
        if (k.busy and not reader.done.is_set() and k.alive
                and await asyncio.shield(self._interrupt(k, reader))):
            verdict = kernel_verdict(Observed(Ended.CANCELLED, fresh, k.calls, back=True,
                                              interrupted=True))
            return CancelledAfterCleanup(True, verdict.detail, verdict.kernel)
        reader.close()  # before its socket is closed
        info = await asyncio.shield(self._finish(inv.session, k))
        verified, detail = outcome.verify_gone(k.worker.pid, k.worker.cgroup, info, k.zygote.pid)
        verdict = kernel_verdict(Observed(Ended.CANCELLED, fresh, k.calls))
        return CancelledAfterCleanup(verified, detail or "kernel killed and reaped",
                                     verdict.kernel)

    async def _interrupt(self, k: SessionKernel, reader: FrameReader) -> bool:
        """Interrupt the call in flight (``SIGINT``: a ``KeyboardInterrupt`` in its code) and
        wait up to the grace for the kernel to report and be proven idle. True when it came
        back whole (a valid report, nothing over a limit, parked in its loop): it is kept."""
        grace = self.backend.config.kernel_interrupt_grace_s
        until = time.monotonic() + grace
        if not k.worker.signal(signal.SIGINT):
            return False
        reported, _ = await within(reader.done.wait(), grace)
        report = reader.report
        if (not reported or report is None or reader.violation is not None or reader.overflow
                or report.outcome not in KERNEL_SURVIVES or k.ended):
            return False
        try:
            return await idle.prove_idle(k.worker.pid, k.worker.fd, k.uid, until) is None
        except (OSError, ValueError):  # its state unreadable: not proven, so not kept
            return False

    def interrupt(self, sid: str) -> bool:
        """Interrupt the call that runs in the session's kernel now, if any (it ends
        ``killed``/``cancelled``; the kernel is kept when it comes back within the grace)."""
        k = self.kernels.get(sid)
        if k is None or not k.busy or not k.alive:
            return False
        k.wake.set()  # the call sees its reader still reading: an interrupt
        return True

    async def _finish(self, sid: str | None, k: SessionKernel,
                      info: dict[str, Any] | None = None) -> dict[str, Any]:
        """Forget ``k`` (killed and reaped already when ``info`` is given, else now)."""
        if sid is not None and self.kernels.get(sid) is k:
            del self.kernels[sid]
            self.running.discard(sid)
            self.unwatched.discard(sid)
        self.deaths.forget(k.worker.pidfd)
        if info is None:
            info = await standby.abort(k.zygote, k.worker, self.backend.layout)
        k.worker.close()
        return info

    async def _stop(self, sid: str, k: SessionKernel, why: str) -> None:
        """End ``k`` (no call in flight on it) and verify that it is gone (logged if not)."""
        self._ending(sid, k, why)
        info = await self._finish(sid, k)
        verified, detail = outcome.verify_gone(k.worker.pid, k.worker.cgroup, info, k.zygote.pid)
        if not verified:
            log.warning("restricted: session %s kernel (pid %d) not proven gone: %s",
                        sid, k.worker.pid, detail)

    async def end(self, sid: str, why: str = "restarted", *, forget: bool = False) -> bool:
        """End the session's kernel; a call in flight on it is killed and ends ``lost`` with
        ``why`` (its own cleanup runs). ``forget``: the session is gone - calls of it still
        queued are refused, and any kernel is ended once they are done. True when a live
        kernel was ended."""
        self.pending.pop(sid, None)  # a restarted or closed fork starts empty
        slept = self.hibernation.drop(sid)
        if forget:
            self.closed[sid] = None
            while len(self.closed) > CLOSED_MEMORY:
                self.closed.popitem(last=False)
        k = self.kernels.get(sid)
        was_alive = k is not None and k.alive
        if k is not None:
            self._ending(sid, k, why)
            standby.kill_worker(k.zygote, k.worker)  # at once: an in-flight call sees EOF
        lock = self.locks.setdefault(sid, asyncio.Lock())
        async with lock:
            current = self.kernels.get(sid)
            # a restart ends the kernel it found, not one a queued call has started since
            if current is not None and (forget or current is k):
                await self._stop(sid, current, why)
        if forget and not lock.locked():
            self.locks.pop(sid, None)
        return was_alive or slept

    async def close(self) -> None:
        """End every kernel (the backend closes)."""
        await self.hibernation.stop()
        for sid in list(self.kernels):
            with contextlib.suppress(Exception):
                await self.end(sid, "the sandbox backend closed", forget=True)
