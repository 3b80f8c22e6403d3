"""A call in the session kernel: relayed by the kernel, ended only once the kernel is proven
idle, interrupted (SIGINT) before it is killed (see sandboxd_runner.kernel)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import socket

from sandboxd.protocol.call import WorkerReport, WorkerRequest

from .base import cgroup_counters
from .calls import Call
from .channel import refuse, send_frame, send_report
from .kernel import (
    FIRST_LOOK_S,
    LAST_LOOK_S,
    MAX_INTERRUPT_GRACE_S,
    SPIN_S,
    THREADS_SETTLE_S,
    TICKS,
    Kernel,
)
from .rlimits import Rlimits


def _grace(req: WorkerRequest) -> float:
    """The request's ``interrupt_grace_s`` (bounded by its decoder), at most
    :data:`MAX_INTERRUPT_GRACE_S`."""
    return min(req.runner.interrupt_grace_s, MAX_INTERRUPT_GRACE_S)


class KernelCall(Call):
    """One call in the kernel: its output is relayed by :class:`Kernel`, its end is the
    kernel's answer once the kernel is proven idle (or the kernel's death)."""

    def __init__(self, chan: socket.socket, cid: int, req: WorkerRequest,
                 kernel: Kernel, rlimits: Rlimits = ()) -> None:
        super().__init__(chan, cid, req, rlimits)
        self.kernel = kernel
        self.reply: bytes | None = None
        self.broken: str | None = None
        self.fresh = False
        self.cpu0 = 0
        self.stopped = False  # a kernel_stop request ended it
        self.replied: float | None = None  # when its answer came (monotonic)
        self.next_look = 0.0  # when to look at the kernel again (after its answer)
        self.pause = FIRST_LOOK_S
        self.idle = False  # proven idle after its answer: the call is over
        self.not_idle: str | None = None  # what the kernel did instead, at the last look
        self.given_up = False  # it is ended for not being idle (threads, the grace is over)
        self.grace = _grace(req)
        # ``I`` came: the kernel is killed unless idle by then
        self.interrupt_until: float | None = None
        self.interrupted = False  # SIGINT was sent while its code ran

    def start(self) -> None:
        kernel = self.kernel
        kernel.check()
        for _ in range(2):
            if not kernel.alive:
                kernel.start(self.req, self.rlimits)  # kept for the kernel's life
                self.fresh = True
            self.pid = kernel.pid
            self.cpu0 = kernel.cpu_ticks()
            kernel.current = self
            try:
                kernel.send(self.req)
                return
            except BrokenPipeError:  # it died since: a fresh one
                kernel.current = None
                kernel.stop()
        raise OSError(32, "the kernel died at once")

    def relay(self, kind: bytes, data: bytes) -> None:
        if kind == b"d":
            if not self.relay_display(data):
                self.broken = self.broken or self.display_error
            return
        if self.output_limit or self.hangup:
            return
        data = data[: self.budget.take(len(data))]
        self.output_limit = self.budget.exceeded
        if data:
            try:
                send_frame(self.chan, kind, data, self.cid)
            except OSError:
                self.hangup = True

    @property
    def wake(self) -> float | None:
        looks = [t for t in (self.next_look if self.reply is not None else None,
                             self.interrupt_until) if t is not None]
        return min(looks) if looks else None

    def interrupt(self, now: float) -> None:
        """``I``: SIGINT to the kernel while its code runs (its handler raises
        KeyboardInterrupt there); unless it answers and is proven idle within the grace, it
        is killed then."""
        kernel = self.kernel
        if self.interrupt_until is not None or not kernel.alive:
            return
        self.interrupt_until = now + self.grace
        if self.reply is None and kernel.rep_r is not None:
            kernel.on_pipe(kernel.rep_r)  # an answer already written is no reason to interrupt
        if self.reply is None and kernel.alive and not self.broken:
            try:
                kernel.send_interrupt()
                self.interrupted = True
            except OSError:
                pass

    def poll(self, now: float) -> bool:
        """True when the call can be finished: the kernel answered and is proven idle, it
        died, the call hit a limit or was stopped, or it is given up (see the kernel's
        section)."""
        if self.stopping or self.broken:
            return True
        kernel = self.kernel
        kernel.check()
        if not kernel.alive:
            return True
        if self.reply is not None and now >= self.next_look:
            self.not_idle = kernel.not_idle_because()
            if self.replied is None:  # its loop reads its next request within microseconds
                self.replied = now
                spin_until = time.monotonic() + SPIN_S
                while self.not_idle is not None and time.monotonic() < spin_until:
                    os.sched_yield()
                    self.not_idle = kernel.not_idle_because()
            if self.not_idle is None:
                self.idle = True
                return True
            if kernel.threads and now - self.replied >= THREADS_SETTLE_S:
                self.given_up = True
                return True
            self.next_look = time.monotonic() + self.pause
            self.pause = min(self.pause * 2, LAST_LOOK_S)
        if self.interrupt_until is not None and now >= self.interrupt_until:
            self.given_up = True
            if self.reply is None:
                self.not_idle = (f"its code did not come back from the interrupt within "
                                 f"{self.grace:g} s")
            elif self.not_idle:
                self.not_idle = f"the kernel answered but never went idle ({self.not_idle})"
            return True
        return False

    def finish(self) -> None:
        kernel = self.kernel
        group_gone = True
        exit_code = sig = not_idle = None
        lost = False
        if (self.idle and self.reply is not None and not self.stopping and not self.broken
                and kernel.alive):
            kernel.drain()
            group_gone = kernel.sweep()
            exit_code = self.reply[0]
            self.value_buf = bytearray(kernel.answer_body(self.reply))
            cpu = kernel.cpu_ticks() - self.cpu0
        else:  # the kernel died, or the call hit a limit or was stopped: the kernel ends
            cpu = kernel.cpu_ticks() - self.cpu0 if kernel.alive else 0
            if kernel.alive:
                kernel.drain()
                kernel.stop()
            status, _, group_gone = kernel.ended
            exit_code = (os.waitstatus_to_exitcode(status)
                         if status is not None and os.WIFEXITED(status) else None)
            sig = (os.WTERMSIG(status)
                   if status is not None and os.WIFSIGNALED(status) else None)
            lost = True
            if self.given_up and self.not_idle:
                not_idle = self.not_idle[:500]
        kernel.current = None
        oom1, pids1 = cgroup_counters()
        self.send_exit_record(WorkerReport(
            exit_code=exit_code, signal=sig, kernel_lost=lost, not_idle=not_idle,
            cpu_ms=max(int(cpu * 1000 / TICKS), 0),
            peak_memory_bytes=kernel.peak_memory() if kernel.alive else 0,
            wall_ms=int((time.monotonic() - self.started) * 1000),
            oom=oom1 > self.oom0, pids_limit=self.pids_limit or pids1 > self.pids0,
            output_limit=self.output_limit, group_gone=group_gone, kernel_fresh=self.fresh,
            kernel_calls=kernel.calls, kernel_stopped=self.stopped,
            kernel_interrupted=self.interrupted and not lost, error=self.broken or None))


def start_kernel_call(chan: socket.socket, cid: int, req: WorkerRequest, kernel: Kernel,
                      calls: dict[int, Call], owners: dict[int, Any],
                      rlimits: Rlimits = ()) -> None:
    if kernel.current is not None:
        refuse(chan, cid, "the session's kernel is busy with another call")
        return
    call = KernelCall(chan, cid, req, kernel, rlimits)
    try:
        call.start()
    except OSError as exc:
        kernel.current = None
        kernel.stop()
        refuse(chan, cid, f"cannot start the kernel: {exc.strerror}",
                exc.errno == 11 or cgroup_counters()[1] > call.pids0)
        return
    calls[cid] = call
    for pfd in kernel.pipes:
        owners[pfd] = kernel


def stop_kernel(chan: socket.socket, cid: int, kernel: Kernel) -> None:
    """A ``kernel_stop`` request: end the kernel (a call in it ends as stopped)."""
    was = kernel.alive
    if kernel.current is not None:
        kernel.current.stopped = True
    kernel.stop()
    try:
        send_report(chan, cid, WorkerReport(kernel_lost=was))
    except OSError:
        pass
