"""The session kernel, as the runner keeps it (its process side is
sandboxd_runner.kernel_loop; a call in it, sandboxd_runner.kernel_calls).

A python request with ``"kernel": true`` (a session's call) runs in the container's kernel:
one persistent interpreter, forked from this runner like a worker (its own session and
process group, oom_score_adj 1000, the request's environment, dumpable only after every
inherited fd but its own pipes is closed), started by the first such call and kept until
it dies, a call of it hits a limit or is stopped, or a ``kernel_stop`` request. Its globals
persist between calls; one call at a time. The runner writes it length-prefixed requests
(marshal) on a pipe; it answers each with one ``v`` frame (sandboxd/protocol/wire.py: exit status
byte + the value's JSON) on another, read with a bounded decoder: the kernel is user code,
its answers are hostile. Its stdout/stderr and its display frames are three persistent
pipes, relayed under the call's output budget and display caps while a call runs and
discarded between calls. After each call the processes it left in the kernel's process
group are killed.

The end of a call cannot be forged. A ``v`` answer is the kernel's own word, and user code
in the kernel can write one and run on. So the runner ends a call (sends its exit record)
only once it has proven from outside, in /proc and never from the kernel's words, that the
kernel is back in its loop and idle (:meth:`Kernel.not_idle_because`): blocked in ``read``
on its request fd (``/proc/PID/syscall``), alone (``Threads: 1``) and with every signal it
catches blocked (``/proc/PID/status``: the loop blocks them all before it reads, so that no
handler or timer can wake it). Such a process runs nothing until its next request. The
runner looks at once after the answer, again and again for a fraction of a millisecond
(the loop reads its next request within microseconds), then after short growing pauses
(its select loop never waits longer). A kernel never proven idle gets no exit record: the
daemon's deadline stops the call (``I``, then ``K``) and the kernel with it. One case is
decided here: a kernel parked in its loop that still runs other threads after
THREADS_SETTLE_S (the call's code left a thread running, which could write into a later
call) is ended, and its record says why (``not_idle``). Numeric libraries start no thread
pools of their own in a kernel: OPENBLAS/OMP/MKL_NUM_THREADS are 1 unless the request's
environment sets them.

Interrupt before kill: ``I`` (the call's deadline, a cancel, an interrupt request) makes the
runner send SIGINT to the kernel, whose handler raises KeyboardInterrupt in the user's code
while it runs (deferred while a display frame is being written, dropped once the code has
ended: :func:`sandboxd_runner.interrupts.interrupt_user_code`). A kernel that answers and is
proven idle within the request's ``interrupt_grace_s`` is kept (the record says
``kernel_interrupted``); else the runner kills it (``kernel_lost``, ``not_idle`` says why). A
kernel that had answered already but was not proven idle gets no signal: the same grace, then
it is killed.
"""

from __future__ import annotations

import marshal
import os
import signal
import struct
import time
from typing import Any

from sandboxd.protocol import wire
from sandboxd.protocol.call import WorkerRequest

from .base import killpg, wait_group_gone, write_all
from .channel import CHUNK
from .execution import MAX_VALUE_JSON
from .kernel_loop import KCTL, kernel_child
from .rlimits import Rlimits

KERNEL_REPLY = {b"v": (1, 1 + MAX_VALUE_JSON)}
#: ``read(2)``'s number (``/proc/PID/syscall`` shows numbers) on the machines sandboxd runs on
READ_SYSCALL = {"x86_64": 0, "aarch64": 63}.get(os.uname().machine, -1)
#: how long the runner looks again and again at a kernel that just answered (its loop reads
#: the next request within microseconds), then the pauses between looks, at first and at most
SPIN_S, FIRST_LOOK_S, LAST_LOOK_S = 0.0003, 0.0005, 0.02
#: how long a kernel parked in its loop may still run other threads before it is ended
THREADS_SETTLE_S = 1.0
MAX_INTERRUPT_GRACE_S = 60.0


def _proc_stat(pid: int | str) -> tuple[int, str, int] | None:
    """(pgrp, state, cpu ticks) of a process from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[2]), fields[0], int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


TICKS = os.sysconf("SC_CLK_TCK")


def _status_field(status: bytes, name: bytes) -> bytes | None:
    """The value of field ``name`` of a /proc/PID/status text, or None (the process name, the
    first line, has its newlines escaped: no line can pose as another field)."""
    start = status.find(b"\n" + name + b":")
    if start < 0:
        return None
    start += len(name) + 2
    end = status.find(b"\n", start)
    return status[start:end if end >= 0 else len(status)].strip()


def _read_proc(dfd: int, name: str, size: int) -> bytes:
    """A file of the /proc directory ``dfd`` (one read: these are generated whole)."""
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


class Kernel:
    """The container's session kernel, as the runner keeps it (a python one; see
    :mod:`.bash_kernel` for the other): ``PARKED_FD`` is the fd its loop reads requests on."""

    PARKED_FD = KCTL

    def __init__(self) -> None:
        self.pid: Any = None
        self.calls = 0
        self.ctl_w: Any = None
        self.rep_r: int | None = None
        self.streams: dict[int, bytes] = {}  # out/err pipe fd -> frame kind
        self.pipes: set[int] = set()
        self.current: Any = None  # the KernelCall running now
        self.decoder: Any = None
        # (wait status, rusage, group gone) of the last one
        self.ended: tuple[Any, Any, bool] = (None, None, True)
        self.threads = False  # the last look found it parked but with other threads
        self.proc_fd: int | None = None  # its /proc directory

    @property
    def alive(self) -> bool:
        return self.pid is not None

    def start(self, req: WorkerRequest, rlimits: Rlimits = ()) -> None:
        """Fork a fresh kernel (with the rlimits of the call that starts it)."""
        ctl_r, self.ctl_w = os.pipe()
        self.rep_r, rep_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        disp_r, disp_w = os.pipe()
        try:
            pid = os.fork()
            if pid == 0:
                self.child(req, ctl_r, rep_w, out_w, err_w, disp_w, rlimits)  # never returns
        finally:
            for fd in (ctl_r, rep_w, out_w, err_w, disp_w):
                os.close(fd)
        self.pid, self.calls = pid, 0
        try:  # this very process's /proc directory (a reused pid is another directory)
            self.proc_fd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            self.proc_fd = None  # never proven idle: its calls end at their deadline
        self.streams = {out_r: b"o", err_r: b"e", disp_r: b"d"}
        self.pipes = {out_r, err_r, disp_r, self.rep_r}
        for fd in self.pipes:
            os.set_blocking(fd, False)

    @staticmethod
    def child(req: WorkerRequest, ctl_r: int, rep_w: int, out_w: int, err_w: int,
              disp_w: int, rlimits: Rlimits) -> None:
        """In the fork: become the kernel (never returns)."""
        kernel_child(req, ctl_r, rep_w, out_w, err_w, disp_w, rlimits)

    @staticmethod
    def answer_body(reply: bytes) -> bytes:
        """What the exit record takes from an answer after its status byte (the value's
        JSON, :func:`.execution.answer_fields`)."""
        return reply[1:]

    def send_interrupt(self) -> None:
        """The runner's interrupt: SIGINT to the kernel (a KeyboardInterrupt in its code)."""
        os.kill(self.pid, signal.SIGINT)

    def send(self, req: WorkerRequest) -> None:
        """Hand the kernel a call (it reads it at once: it is idle)."""
        # marshal (C code only, unlike json) keeps the kernel's loop independent of builtins
        caps = req.display
        body = marshal.dumps({"code": req.code, "imports_allow": list(req.imports_allow),
                              "imports_deny": list(req.imports_deny),
                              "display": {"item_bytes": int(caps.item_bytes),
                                          "count": int(caps.count)}})
        data = struct.pack(">I", len(body)) + body
        self.decoder = wire.Decoder(KERNEL_REPLY, max_frames=1,
                                    max_bytes=wire.HEADER.size + 1 + MAX_VALUE_JSON)
        self.calls += 1
        write_all(self.ctl_w, data)

    def on_pipe(self, fd: int) -> None:
        """Output or an answer of the kernel (a call's, or stray between calls)."""
        if fd not in self.pipes:
            return
        if self.streams.get(fd) == b"d":
            self.drain_text()  # what was printed before the item goes first: written order
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        call = self.current
        if not data:
            self.pipes.discard(fd)
            os.close(fd)
            if fd == self.rep_r:
                self.rep_r = None
                self.stop()  # its answer pipe is gone: the kernel is dead or broken
            return
        if fd != self.rep_r:
            if call is not None:
                call.relay(self.streams[fd], data)
            return
        frames = None
        if call is not None and call.reply is None:
            try:
                frames = self.decoder.feed(data)
            except wire.ProtocolError:
                frames = None
            else:
                if not frames:
                    return  # a part of the answer
        if not frames:  # a malformed answer, or one nobody asked for: the kernel ends
            if call is not None:
                call.broken = "the kernel broke its answer protocol"
            self.stop()
            return
        call.reply = frames[0].payload

    def check(self) -> None:
        """Notice a kernel that died by itself (between calls, or with its pipes held open
        by a process it forked)."""
        if self.pid is None:
            return
        try:
            done, status, usage = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:
            done, status, usage = self.pid, None, None
        if done == self.pid:
            self.stop(status, usage)

    def drain_text(self) -> None:
        """Relay what the kernel's stdout and stderr pipes hold now (bounded; see
        ``Call.drain_text``)."""
        self._drain([f for f, kind in self.streams.items() if kind != b"d"], for_call=True)

    def drain(self) -> None:
        """Relay what the kernel wrote before it answered (it is in the pipes already)."""
        self._drain(list(self.streams), for_call=False)

    def _drain(self, fds: list[int], *, for_call: bool) -> None:
        """Read what ``fds`` hold now (64 chunks at most each) and relay it to the current
        call. ``for_call``: stop when there is no current call (what is left stays in the
        pipes); otherwise read it and drop it without one."""
        for fd in fds:
            for _ in range(64):
                if fd not in self.pipes or (for_call and self.current is None):
                    break
                try:
                    data = os.read(fd, CHUNK)
                except OSError:
                    break
                if not data:
                    break
                if self.current is not None:
                    self.current.relay(self.streams[fd], data)

    def stop(self, status: int | None = None, usage: Any = None) -> None:
        """Kill the kernel and its process group (``status``: it was reaped already)."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        killpg(pid)
        if status is None:
            try:
                _, status, usage = os.wait4(pid, 0)
            except ChildProcessError:
                status, usage = None, None
        killpg(pid)
        self.ended = (status, usage, wait_group_gone(pid))
        self.drain()  # what it wrote before it died is the call's output
        for fd in [*self.pipes, self.ctl_w, self.proc_fd]:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.pipes, self.streams, self.ctl_w, self.rep_r = set(), {}, None, None
        self.proc_fd = None

    def sweep(self, wait_s: float = 1.0) -> bool:
        """Kill what the last call left in the kernel's process group (not the kernel);
        True once nothing is left. A killed process takes a moment to die (longer on a loaded
        host): killed again and looked for until ``wait_s`` has passed."""
        deadline = time.monotonic() + wait_s
        while True:
            left = False
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) == self.pid:
                    continue
                st = _proc_stat(name)
                if st and st[0] == self.pid and st[1] != "Z":
                    left = True
                    try:
                        os.kill(int(name), signal.SIGKILL)
                    except OSError:
                        pass
            if not left:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def cpu_ticks(self) -> int:
        st = _proc_stat(self.pid) if self.pid else None
        return st[2] if st else 0

    def peak_memory(self) -> int:
        try:
            with open(f"/proc/{self.pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError, TypeError):
            pass
        return 0

    def not_idle_because(self) -> str | None:
        """None when the kernel is parked in its loop (see "the session kernel": blocked
        reading its request fd, alone, every signal it catches blocked), else what it does
        instead; ``threads`` is True when only its other threads keep it from being idle."""
        self.threads = False
        if self.proc_fd is None:
            return "its state could not be read"
        try:
            syscall = _read_proc(self.proc_fd, "syscall", 512).split()
        except OSError as exc:
            return f"its state could not be read ({type(exc).__name__})"
        if not syscall or syscall[0] == b"running":
            return "it is running"
        try:
            parked = int(syscall[0]) == READ_SYSCALL and int(syscall[1], 16) == self.PARKED_FD
        except (IndexError, ValueError):
            parked = False
        if not parked:
            return (f"it is in system call {syscall[0].decode(errors='replace')[:20]}, "
                    "not waiting for its next request")
        try:
            status = _read_proc(self.proc_fd, "status", 16384)
        except OSError as exc:
            return f"its state could not be read ({type(exc).__name__})"
        threads = _status_field(status, b"Threads")
        if threads != b"1":
            self.threads = True
            return ("the call's code left threads running "
                    f"({(threads or b'?').decode(errors='replace')[:20]} threads)")
        return self.signals_not_idle(status)

    @staticmethod
    def signals_not_idle(status: bytes) -> str | None:
        """Why its signals keep a kernel parked in its loop from being idle (its loop blocks
        every signal it catches), or None."""
        blk, cgt = _status_field(status, b"SigBlk"), _status_field(status, b"SigCgt")
        try:
            if blk is None or cgt is None:
                raise ValueError("no signal mask")
            blocked, caught = int(blk, 16), int(cgt, 16)
        except ValueError:
            return "its signal masks could not be read"
        if caught & ~blocked:
            return "a signal it catches could still wake it"
        return None
