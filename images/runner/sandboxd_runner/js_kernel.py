"""The session's JavaScript/TypeScript kernel: one persistent ``node`` process per container
(``js_kernel.js`` beside this module is its loop), so that a session's ``javascript`` and
``typescript`` calls share their globals, functions, classes and required modules.

It is forked from the runner like the python kernel (see :mod:`.kernel`: its own session and
process group, oom_score_adj 1000, the request's environment, the call's rlimits kept for its
life, the same pipes, relay and output caps) and then executes ``node``, confined first by
Landlock to executing node alone: whatever the code reaches (``child_process`` through a
bypass of the module rule, say) can start no other program. Its fds: 0 ``/dev/null``, 1 and 2
the output pipes, 3 the requests, 4 the answers, 5 the display frames, 6 the runner's
acknowledgements of display frames (non-blocking; one byte per read of the display pipe, so
``display()`` returns once what was printed before it has been relayed).

Proven idle as the python kernel is (:meth:`Kernel.not_idle_because`): its main thread
blocked in ``read`` on its request fd (3), which stops its event loop, so no timer, callback
or promise of the user's runs until the next request. Node runs threads of its own (V8's
platform workers, libuv's pool; the kernel starts the pool before it first parks), so
instead of ``Threads: 1`` the proof is "no more threads than when it first parked": a
``worker_threads`` thread the call left (running JavaScript while the main thread waits)
keeps it from being idle and ends the kernel, as a python thread does. Node catches signals
through libuv (whose handler only writes to a pipe the loop reads), so the signal part of the
proof is the bash kernel's: none pending.

Interrupt: SIGINT. Code running synchronously in the call (a ``while (true) {}``) is stopped
by node's ``breakOnSigint`` watchdog; a call waiting on a promise is abandoned by the kernel's
SIGINT listener; either way it answers and keeps its state. A busy loop after an ``await``
runs outside both: it ignores the interrupt and the runner kills the kernel after the grace.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import time
from pathlib import Path
from typing import Any

from sandboxd.protocol import wire
from sandboxd.protocol.call import WorkerRequest

from .base import find_program, write_all
from .bash_kernel import BashKernel
from .execution import MAX_VALUE_JSON
from .kernel import KERNEL_REPLY, Kernel
from .kernel_child import confine_child, place_fds
from .rlimits import Rlimits

JS_CTL, JS_REP, JS_DISP, JS_ACK = 3, 4, 5, 6
LOOP = str(Path(__file__).with_name("js_kernel.js"))
#: node's own threads: V8's platform workers, libuv's pool (fewer than its default 4 each:
#: they count against the container's pids limit)
NODE_ARGV = ["node", "--v8-pool-size=2", "--disable-proto=delete", LOOP, str(MAX_VALUE_JSON)]
NODE_ENV = {"UV_THREADPOOL_SIZE": "2"}
#: how long the runner waits for a fresh kernel to park before its first call (node starts
#: in tens of milliseconds; a loaded host takes longer)
PARK_WAIT_S = 10.0


def node_child(req: WorkerRequest, fds: dict[int, int], rlimits: Rlimits = ()) -> None:
    """In the fork: fds, session, signals, limits, the exec confinement, then ``node``."""
    try:
        os.setsid()
        path = req.runner.env.get("PATH", "/usr/bin:/bin")
        node = find_program("node", path)
        if node is None:
            raise OSError(2, "there is no node in this image (the javascript profile has it)")
        place_fds({0: os.open(os.devnull, os.O_RDONLY), **fds}, [(JS_ACK + 1, 65536)])
        os.set_blocking(JS_ACK, False)
        # node by name: its ELF interpreter too
        confine_child("javascript", req.runner.cwd, rlimits, ["node"], path)
        os.execve(node, NODE_ARGV, {**req.runner.env, **NODE_ENV})
    except BaseException as exc:
        try:
            os.write(2, f"sandboxd javascript kernel: {exc}\n".encode())
        finally:
            os._exit(126)


class NodeKernel(Kernel):
    """The container's JavaScript/TypeScript kernel, as the runner keeps it."""

    PARKED_FD = JS_CTL

    def __init__(self) -> None:
        super().__init__()
        self.ack: tuple[int, int] | None = None  # (node's end, the runner's end)
        self.disp_r: int | None = None
        self.baseline: int | None = None  # its thread count when it first parked

    def start(self, req: WorkerRequest, rlimits: Rlimits = ()) -> None:
        """Fork a fresh kernel, then wait (bounded) until it parks: its threads then are
        its own, counted before any user code runs."""
        self.ack = os.pipe()
        self.baseline = None
        try:
            super().start(req, rlimits)
        finally:
            os.close(self.ack[0])
        os.set_blocking(self.ack[1], False)
        self.disp_r = next(fd for fd, kind in self.streams.items() if kind == b"d")
        until = time.monotonic() + PARK_WAIT_S
        while self.alive and time.monotonic() < until:
            reason = self.not_idle_because()
            if reason is None or self.threads:
                break
            time.sleep(0.002)

    def child(self, req: WorkerRequest, ctl_r: int, rep_w: int,  # type: ignore[override]
              out_w: int, err_w: int, disp_w: int, rlimits: Rlimits) -> None:
        assert self.ack is not None
        node_child(req, {1: out_w, 2: err_w, JS_CTL: ctl_r, JS_REP: rep_w, JS_DISP: disp_w,
                         JS_ACK: self.ack[0]}, rlimits)

    def send(self, req: WorkerRequest) -> None:
        """Hand the kernel a call: a length-prefixed JSON request."""
        caps = req.display
        body = json.dumps({
            "code": req.code, "typescript": req.kind == "typescript",
            "modules": {"allow": list(req.imports_allow), "deny": list(req.imports_deny)},
            "display": {"item_bytes": int(caps.item_bytes), "count": int(caps.count)},
        }).encode()
        self.decoder = wire.Decoder(KERNEL_REPLY, max_frames=1,
                                    max_bytes=wire.HEADER.size + 1 + MAX_VALUE_JSON)
        self.calls += 1
        write_all(self.ctl_w, struct.pack(">I", len(body)) + body)

    def on_pipe(self, fd: int) -> None:
        """As the python kernel's, and a display frame read is acknowledged."""
        super().on_pipe(fd)
        if fd == self.disp_r and self.ack is not None and self.alive:
            try:
                os.write(self.ack[1], b".")
            except OSError:
                pass

    def send_interrupt(self) -> None:
        """SIGINT to node (its watchdog or its listener; see the module's docstring)."""
        os.kill(self.pid, signal.SIGINT)

    def stop(self, status: int | None = None, usage: Any = None) -> None:
        super().stop(status, usage)
        if self.ack is not None:
            try:
                os.close(self.ack[1])
            except OSError:
                pass
            self.ack = None
        self.disp_r = None

    def threads_not_idle(self, threads: bytes | None) -> bool:
        """More threads than when it first parked (the first look sets the count)."""
        try:
            count = int(threads or b"")
        except ValueError:
            return True
        if self.baseline is None:
            self.baseline = count
        return count > self.baseline

    #: none pending (libuv's handler only writes to a pipe: see the module's docstring)
    signals_not_idle = staticmethod(BashKernel.signals_not_idle)
