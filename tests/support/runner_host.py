"""Run requests through the container runner's own loop, on the host (for tests).

The runner's modules are imported from ``images/runner/`` (:func:`tests.support.plan.
runner_module`); a request goes in as its ``R`` frame would (``main._start``, with one end of
a socketpair as the channel) and the calls it starts are driven by the runner's own pieces
(``on_pipe``, ``_finish_calls``) until they end, so a test sees the frames the daemon would
see: what was refused and why, the worker's output, the exit record.
"""

from __future__ import annotations

import json
import os
import select
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxd.protocol import wire
from sandboxd.protocol.call import WorkerReport, WorkerRequest
from tests.support.plan import runner_module


@dataclass
class Reply:
    """The frames of one call: its stdout, stderr and exit record."""

    stdout: bytes = b""
    stderr: bytes = b""
    #: the exit record, decoded as the daemon decodes it
    record: WorkerReport = field(default_factory=WorkerReport)
    started: bool = False  # the runner started a call (it was not refused)
    pid: int | None = None  # the call's worker (or the program posix_spawn started)


def run_request(request: dict[str, Any], cwd: Path, timeout_s: float = 30.0,
                frames: list[tuple[bytes, bytes]] | None = None) -> Reply:
    """Send ``request`` (``cwd`` added) to the runner's loop and relay its call to the end;
    ``frames`` (kind, payload) follow it on the channel once it started, for its call."""
    main = runner_module("main")
    chan, daemon = socket.socketpair()
    daemon.setblocking(False)
    decoder = wire.Decoder({k: (0, 64 * 1024 * 1024) for k in (b"o", b"e", b"d", b"x")})
    calls: dict[int, Any] = {}
    owners: dict[int, Any] = {}
    reply = Reply()
    try:
        main._start(chan, 1, json.dumps({"cwd": str(cwd), **request}).encode(), calls, owners)
        reply.started = bool(calls)
        reply.pid = next(iter(calls.values())).pid if calls else None
        channel = wire.Decoder(main.FRAME_SIZES)
        for kind, payload in frames or ():
            daemon.sendall(wire.encode(kind, payload, 1))
        deadline = time.monotonic() + timeout_s  # catches a hang only
        while calls:
            assert time.monotonic() < deadline, f"the call did not end within {timeout_s} s"
            ready, _, _ = select.select([*owners, daemon, chan], [], [], 0.05)
            for fd in ready:
                if fd is chan:
                    assert main._on_channel(chan, channel, calls, owners)
                elif fd in owners and fd in owners[fd].pipes:
                    owners[fd].on_pipe(fd)
            _read(daemon, decoder, reply)
            main._finish_calls(calls, owners, time.monotonic())
    finally:
        for call in calls.values():
            runner_module("base").killpg(call.pid)
        chan.close()
    _read(daemon, decoder, reply)
    daemon.close()
    return reply


def _read(daemon: socket.socket, decoder: wire.Decoder, reply: Reply) -> None:
    """What the runner has sent so far, into ``reply``."""
    while True:
        try:
            data = daemon.recv(1 << 20)
        except BlockingIOError:
            return
        if not data:
            return
        for frame in decoder.feed(data):
            if frame.kind == b"o":
                reply.stdout += frame.payload
            elif frame.kind == b"e":
                reply.stderr += frame.payload
            elif frame.kind == b"x":
                reply.record = WorkerReport.from_wire(json.loads(frame.payload))


def stop_kernel() -> Reply:
    """End the runner's session kernel (the one its loop keeps), if one runs."""
    return run_request(WorkerRequest.stop_kernel().to_wire(), Path(os.getcwd()))
