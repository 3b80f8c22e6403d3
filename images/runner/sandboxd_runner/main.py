"""The runner's main loop: one process, one select loop over the channel, every call's pipes
and worker (see the package's docstring)."""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any, Literal

from sandboxd.protocol import wire
from sandboxd.protocol.call import WorkerReport, WorkerRequest

from .base import cgroup_counters, killpg, set_dumpable, site_dirs
from .bash_kernel import BashKernel
from .calls import Call
from .channel import KEY_BYTES, open_channel, reconnect, refuse, send_report
from .js_kernel import NodeKernel
from .kernel import Kernel
from .kernel_calls import start_kernel_call, stop_kernel
from .rlimits import requested_rlimits

MAX_REQUEST = 64 * 1024 * 1024
#: the daemon's frames (see the package's docstring) and their payload sizes
FRAME_SIZES = {b"R": (2, MAX_REQUEST), b"K": (0, 0), b"I": (0, 0),
               b"i": (1, wire.READ_BYTES), b"c": (0, 0)}
KERNEL = Kernel()  # the container's session kernel (started by its first call)
#: its bash kernel: a container serves one language's kernel (the daemon gives a session's
#: bash calls a container of their own)
BASH = BashKernel()
NODE = NodeKernel()  # javascript and typescript calls share it (and its globals)
#: the kernel of each language a request may name (``kind``)
KERNELS: dict[str, Kernel] = {"python": KERNEL, "bash": BASH, "javascript": NODE,
                              "typescript": NODE}


def _stop_kernels() -> None:
    for kernel in set(KERNELS.values()):
        kernel.stop()
#: the one-time key of the next daemon (a ``suspend`` request: the daemon stops and keeps the
#: session, so that the next daemon finds its kernel alive)
RESUME = bytearray()


def _suspend(chan: socket.socket, cid: int, req: WorkerRequest, calls: dict[int, Call]) -> None:
    """The daemon stops and keeps this session (a restart that keeps sessions): remember the
    next daemon's one-time key, answer ``suspended``."""
    if len(req.runner.resume_key) != 2 * KEY_BYTES or calls:
        refuse(chan, cid, "refused: a suspend needs a key and no call running")
        return
    RESUME[:] = bytes.fromhex(req.runner.resume_key)
    send_report(chan, cid, WorkerReport(message="suspended"))


def _start(chan: socket.socket, cid: int, body: bytes, calls: dict[int, Call],
           owners: dict[int, Any]) -> None:
    """Start the call a request frame asks for (or answer why it cannot start)."""
    if cid in calls:
        return
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        refuse(chan, cid, "malformed request")
        return
    try:  # checked whole before anything starts: never applied in part
        req = WorkerRequest.from_wire(data)
        if req.kind == "kernel_stop":
            stop_kernel(chan, cid, next((k for k in KERNELS.values() if k.alive), KERNEL))
            return
        if req.kind == "suspend":  # answered at once; kept for when the daemon hangs up
            _suspend(chan, cid, req, calls)
            return
        rlimits = requested_rlimits(req.limits.rlimits())
    except ValueError as exc:
        refuse(chan, cid, f"refused: {exc}")
        return
    if req.kind in KERNELS and (req.kind != "python" or req.kernel):
        # a call of another language always runs in its kernel (one-shot: the container's
        # only call)
        kernel = KERNELS[req.kind]
        if "\0" in req.code or any(k.alive for k in KERNELS.values() if k is not kernel):
            refuse(chan, cid, "refused: NUL in the code, or another language's kernel "
                              "lives in this container")
            return
        start_kernel_call(chan, cid, req, kernel, calls, owners, rlimits)
        return
    call = Call(chan, cid, req, rlimits)
    try:
        call.start()
    except OSError as exc:
        for pfd in call.pipes:
            os.close(pfd)
        refuse(chan, cid, f"cannot start the process: {exc.strerror}",
               exc.errno == 11 or cgroup_counters()[1] > call.pids0)
        return
    calls[cid] = call
    for pfd in call.pipes:
        owners[pfd] = call


def _prepare() -> None:
    """Before the channel: the image's packages importable, SIGPIPE ignored, not dumpable, the
    imported modules' pages kept shared with every fork."""
    sys.path.extend(site_dirs())
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.umask(0o022)
    if not set_dumpable(0):
        sys.exit(4)  # never serve calls with our memory and fds readable by user code
    # Everything imported so far is shared with every forked worker: keep the garbage
    # collector from touching (and so copying) those pages after each fork.
    gc.collect()
    gc.freeze()


def _timeout(calls: dict[int, Call]) -> float | None:
    """How long select may wait: a tick while calls run, sooner when one must be looked at."""
    timeout = 0.05 if calls else None
    wakes = [call.wake for call in calls.values() if call.wake is not None]
    # a kernel that answered is looked at again soon (see the kernel's section)
    if wakes and timeout is not None:  # (wakes: calls run, so there is a tick)
        timeout = min(timeout, max(min(wakes) - time.monotonic(), 0.0))
    return timeout


def _on_channel(chan: socket.socket, decoder: wire.Decoder, calls: dict[int, Call],
                owners: dict[int, Any]) -> bool | Literal["resume"]:
    """Read the channel and act on its frames; False once the daemon hung up (or broke the
    protocol): every call and the kernel are stopped then, unless the daemon said it keeps
    the session (``suspend``) and hung up cleanly with no call running: "resume" then (the
    kernel lives on; the caller reconnects)."""
    try:
        data = chan.recv(wire.READ_BYTES, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True
    except OSError:
        data = b""
    try:
        frames = decoder.feed(data) if data else None
    except wire.ProtocolError:
        frames = None
    if frames is None:
        if RESUME and not data and not calls:
            return "resume"
        for call in calls.values():
            killpg(call.pid)
        _stop_kernels()
        return False
    for frame in frames:
        if frame.kind == b"R":
            _start(chan, frame.call, frame.payload, calls, owners)
        elif frame.call not in calls:
            continue
        elif frame.kind == b"I":  # interrupt before kill (a kernel call)
            calls[frame.call].interrupt(time.monotonic())
        elif frame.kind in (b"i", b"c"):  # a command's stdin: data, end of input
            calls[frame.call].on_stdin(frame.payload if frame.kind == b"i" else None)
        else:  # b"K": the daemon stopped waiting for it
            calls[frame.call].hangup = True
    return True


def _finish_calls(calls: dict[int, Call], owners: dict[int, Any], now: float) -> None:
    """Finish every call that is over; forget the pipes that were closed."""
    for cid, call in list(calls.items()):
        call.flush_stdin()  # what a command's full stdin pipe did not take before
        if call.poll(now):
            for pfd in call.pipes:
                owners.pop(pfd, None)
            del calls[cid]
            call.finish()
    for fd in [f for f, owner in owners.items() if f not in owner.pipes]:
        del owners[fd]  # closed (a finished call's, a kernel's that ended)


def main() -> int:
    """One process, one select loop: the channel, every call's pipes and worker."""
    _prepare()
    chan = open_channel()
    cfd = chan.fileno()
    decoder = wire.Decoder(FRAME_SIZES)
    calls: dict[int, Call] = {}  # call id -> Call
    owners: dict[int, Any] = {}  # pipe fd -> Call (or the kernel)
    last_pids_check = 0.0
    while True:
        try:
            ready, _, _ = select.select([cfd, *owners], [], [], _timeout(calls))
        except InterruptedError:
            continue
        for fd in ready:
            if fd == cfd:
                state = _on_channel(chan, decoder, calls, owners)
                if state == "resume":  # the daemon restarts: wait for the next one
                    chan.close()
                    again = reconnect(RESUME)
                    RESUME[:] = bytes(len(RESUME))
                    del RESUME[:]
                    if again is None:
                        _stop_kernels()
                        return 0
                    chan, cfd = again, again.fileno()
                    decoder = wire.Decoder(FRAME_SIZES)
                    break
                if not state:
                    return 0
            elif fd in owners and fd in owners[fd].pipes:
                owners[fd].on_pipe(fd)
        now = time.monotonic()
        if calls and now - last_pids_check >= 0.05:
            last_pids_check = now
            pids_now = cgroup_counters()[1]
            for call in calls.values():
                if pids_now > call.pids0:
                    call.pids_limit = True
        _finish_calls(calls, owners, now)
