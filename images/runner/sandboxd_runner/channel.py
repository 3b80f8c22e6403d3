"""The runner's one channel to the daemon: the key, the connection, frames and refusals.

The daemon leaves a 32-byte key in /run/sandboxd/key; the runner reads it, connects once to
/run/sandboxd/runner.sock and says hello with it (call 0, frame ``h``); the daemon then removes
the socket and the key. Every call of the container is multiplexed on that channel by call id
(frames of sandboxd/protocol/wire.py).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

from sandboxd.protocol import wire
from sandboxd.protocol.call import WorkerReport

SOCKET_PATH = os.environ.get("SANDBOXD_RUNNER_SOCKET", "/run/sandboxd/runner.sock")
KEY_PATH = os.path.join(os.path.dirname(SOCKET_PATH), "key")
KEY_BYTES = 32
CHUNK = wire.READ_BYTES  # the daemon refuses bigger output frames


def send_frame(sock: socket.socket, kind: bytes, payload: bytes, call: int = 0) -> None:
    sock.sendall(wire.encode(kind, payload, call))


def connect() -> socket.socket:
    deadline = time.monotonic() + 30
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(SOCKET_PATH)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                sys.exit(3)
            time.sleep(0.005)


def open_channel() -> socket.socket:
    """Read the key, connect once, say hello with it; then forget the key."""
    key = bytearray(KEY_BYTES)
    with open(KEY_PATH, "rb", buffering=0) as fh:
        if fh.readinto(key) != KEY_BYTES:
            sys.exit(3)
    chan = connect()
    try:
        chan.sendall(wire.HEADER.pack(b"h", 0, KEY_BYTES))
        chan.sendall(key)
    finally:
        key[:] = bytes(KEY_BYTES)
    return chan


#: how long a runner told to wait for the next daemon (``suspend``) tries to reconnect
RESUME_WAIT_S = 900.0


def reconnect(key: bytearray) -> socket.socket | None:
    """After the daemon hung up at a clean stop that keeps sessions (its ``suspend`` request
    gave a one-time key): connect again to the socket path, which the next daemon binds anew,
    and say hello with that key. None when no daemon listened within :data:`RESUME_WAIT_S`."""
    deadline = time.monotonic() + RESUME_WAIT_S
    while time.monotonic() < deadline:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(SOCKET_PATH)
            sock.sendall(wire.HEADER.pack(b"h", 0, KEY_BYTES))
            sock.sendall(key)
            return sock
        except OSError:
            sock.close()
            time.sleep(0.05)
    return None
def send_report(chan: socket.socket, cid: int, report: WorkerReport) -> None:
    """The call's ``x`` frame: how it ended (the daemon decodes it with
    :meth:`WorkerReport.from_wire`). Raises OSError."""
    send_frame(chan, b"x", json.dumps(report.to_wire()).encode(), cid)


def refuse(chan: socket.socket, cid: int, message: str, pids_limit: bool = False) -> None:
    """A call that does not start: why (its ``error``)."""
    try:
        send_report(chan, cid, WorkerReport(error=message[:1000], pids_limit=pids_limit))
    except OSError:
        pass
