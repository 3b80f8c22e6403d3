"""A one-shot call in flight: its worker, its output pipes relayed under the call's budget
and display caps, its end (exit status, rusage, the cgroup's OOM and pids events)."""

from __future__ import annotations

import os
import select
import time
from typing import TYPE_CHECKING, Any

from sandboxd.protocol import rules, wire
from sandboxd.protocol.call import WorkerReport, WorkerRequest
from sandboxd.protocol.limits import MAX_STDIN_BYTES

if TYPE_CHECKING:
    import socket

from .base import cgroup_counters, killpg, wait_group_gone
from .channel import CHUNK, send_frame, send_report
from .execution import answer_fields
from .rlimits import Rlimits
from .worker import spawn_command, worker


class Call:
    """One call in flight: its id on the channel, worker process and output pipes."""

    @property
    def wake(self) -> float | None:
        """When poll() must look again, sooner than the loop's usual tick (monotonic)."""
        return None

    def __init__(self, chan: socket.socket, cid: int, req: WorkerRequest,
                 rlimits: Rlimits = ()) -> None:
        self.chan = chan
        self.cid = cid
        self.req = req
        self.rlimits = rlimits  # checked (sandboxd_runner.rlimits)
        self.budget = rules.OutputBudget(req.limits.output_bytes)
        self.oom0, self.pids0 = cgroup_counters()
        self.started = time.monotonic()
        self.pid: Any = None  # the worker's pid once started
        self.streams: dict[int, bytes] = {}
        self.value_r: int | None = None
        self.pipes: set[int] = set()
        self.value_buf = bytearray()
        self.reaped: Any = None  # (status, rusage) once the worker has exited
        self.grace_until = 0.0  # then its leftovers get a moment to flush, not forever
        self.output_limit = False
        self.pids_limit = False
        self.hangup = False
        caps = req.display
        # the user's display frames: bounded by the call's caps (the daemon checks each item)
        self.displays = wire.Decoder({b"d": (2, caps.frame_bytes)}, max_frames=caps.count + 1)
        self.display_error: str | None = None
        # a plan asked for stdin: the pipe's end the daemon's frames are written to, what the
        # command has not read yet, how much came, and whether the daemon closed it
        self.stdin_w: int | None = None
        self.stdin_buf = bytearray()
        self.stdin_total = 0
        self.stdin_closing = False

    def start(self) -> None:
        """Start the worker: posix_spawn for commands, fork for python code."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        value_w = display_w = None
        self.streams = {out_r: b"o", err_r: b"e"}
        if self.req.kind == "python":
            self.value_r, value_w = os.pipe()
            display_r, display_w = os.pipe()
            self.streams[display_r] = b"d"
        in_r = None
        if self.req.runner.stdin and self.req.kind == "plan":
            in_r, self.stdin_w = os.pipe()
            os.set_blocking(self.stdin_w, False)
        self.pipes = set(self.streams) | ({self.value_r} if self.value_r is not None else set())
        for fd in self.pipes:
            os.set_blocking(fd, False)
        try:
            pid = spawn_command(self.req, out_w, err_w, self.rlimits, in_r)
            if pid is None:
                pid = os.fork()
                if pid == 0:
                    worker(self.req, out_w, err_w, value_w, display_w,  # never returns
                           self.rlimits, in_r)
        except OSError:
            self.close_stdin_pipe()
            raise
        finally:
            for wfd in (out_w, err_w, value_w, display_w, in_r):
                if wfd is not None:
                    os.close(wfd)
        self.pid = pid

    @property
    def stopping(self) -> bool:
        return self.hangup or self.output_limit or self.pids_limit

    def interrupt(self, now: float) -> None:
        """``I``: only a kernel call is interrupted (a one-shot call is stopped with ``K``)."""

    def on_pipe(self, fd: int) -> None:
        if self.streams.get(fd) == b"d":
            self.drain_text()  # what was printed before the item goes first: written order
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:  # a stale readiness report (fd numbers are reused)
            return
        except OSError:
            data = b""
        if not data:
            self.pipes.discard(fd)
            os.close(fd)
            return
        if fd == self.value_r:
            if len(self.value_buf) < 2 * 1024 * 1024:
                self.value_buf += data
            return
        if self.streams[fd] == b"d":
            if not self.relay_display(data):
                self.pipes.discard(fd)
                os.close(fd)  # the user's next display() gets EPIPE
            return
        if self.output_limit:
            return
        # one budget for stdout and stderr together (sandboxd/protocol/rules.py)
        data = data[: self.budget.take(len(data))]
        self.output_limit = self.budget.exceeded
        if data:
            try:
                send_frame(self.chan, self.streams[fd], data, self.cid)
            except OSError:
                self.hangup = True

    def on_stdin(self, data: bytes | None) -> None:
        """The daemon's ``i`` frame (``data``) or ``c`` (None: end of input): written to the
        command's stdin as far as the pipe takes it now; the rest at :meth:`flush_stdin`."""
        if self.stdin_w is None:
            return
        if data is None:
            self.stdin_closing = True
        else:
            self.stdin_total += len(data)
            if self.stdin_total > MAX_STDIN_BYTES:  # the daemon refuses this: never hold it
                self.close_stdin_pipe()
                return
            self.stdin_buf += data
        self.flush_stdin()

    def flush_stdin(self) -> None:
        """Write what the command's stdin pipe takes now; close it once the daemon closed it
        and all was written (or the command stopped reading it: EPIPE)."""
        if self.stdin_w is None:
            return
        while self.stdin_buf:
            try:
                written = os.write(self.stdin_w, self.stdin_buf)
            except BlockingIOError:
                return
            except OSError:  # the command closed its end: what is left is not read
                self.close_stdin_pipe()
                return
            del self.stdin_buf[:written]
        if self.stdin_closing:
            self.close_stdin_pipe()

    def close_stdin_pipe(self) -> None:
        if self.stdin_w is not None:
            os.close(self.stdin_w)
            self.stdin_w = None
        self.stdin_buf = bytearray()

    def drain_text(self) -> None:
        """Relay what the stdout and stderr pipes hold now (bounded): the user's display()
        flushed them before writing its item, and waits until the item is read."""
        for fd in [f for f, kind in self.streams.items() if kind != b"d"]:
            for _ in range(64):
                if fd not in self.pipes or not select.select([fd], [], [], 0)[0]:
                    break
                self.on_pipe(fd)

    def relay_display(self, data: bytes) -> bool:
        """Relay the user's display frames; False once they broke the bounds (the call then
        reports an error, and nothing more is read)."""
        if self.display_error is not None or self.hangup:
            return False
        try:
            frames = self.displays.feed(data)
        except wire.ProtocolError as exc:
            self.display_error = f"display(): {exc}"
            return False
        for frame in frames:
            try:
                send_frame(self.chan, b"d", frame.payload, self.cid)
            except OSError:
                self.hangup = True
                return False
        return True

    def poll(self, now: float) -> bool:
        """Reap the worker without blocking; True when the call can be finished."""
        if self.reaped is None:
            try:
                done, status, usage = os.wait4(self.pid, os.WNOHANG)
            except ChildProcessError:
                done, status, usage = self.pid, 0, None
            if done == self.pid:
                self.reaped = (status, usage)
                self.grace_until = now + 0.2
        if self.stopping:
            return True
        return self.reaped is not None and (not self.pipes or now > self.grace_until)

    def finish(self) -> None:
        """Stop what is left of the call, report how it ended, release everything."""
        if self.stopping:
            killpg(self.pid)
        if self.reaped is None:
            _, status, usage = os.wait4(self.pid, 0)
        else:
            status, usage = self.reaped
        killpg(self.pid)  # anything the worker left behind in its process group (`cmd &`)
        group_gone = wait_group_gone(self.pid)
        oom1, pids1 = cgroup_counters()
        self.send_exit_record(WorkerReport(
            exit_code=os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
            signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            cpu_ms=int((usage.ru_utime + usage.ru_stime) * 1000) if usage else 0,
            peak_memory_bytes=int(usage.ru_maxrss) * 1024 if usage else 0,
            wall_ms=int((time.monotonic() - self.started) * 1000),
            oom=oom1 > self.oom0, pids_limit=self.pids_limit or pids1 > self.pids0,
            output_limit=self.output_limit, group_gone=group_gone,
            error=self.display_error or None))
        for fd in self.pipes:
            os.close(fd)
        self.pipes = set()
        self.close_stdin_pipe()

    def send_exit_record(self, report: WorkerReport) -> None:
        """The call's ``x`` frame: ``report`` with what the worker reported (its value,
        message), unless the daemon hung up on the call."""
        if self.value_buf:
            report = answer_fields(report, self.value_buf)
        if not self.hangup:
            try:
                send_report(self.chan, self.cid, report)
            except OSError:
                pass
