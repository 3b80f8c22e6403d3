"""The zygote's wire protocol, imported by both sides (the daemon's
:mod:`~sandboxd.backends.restricted.backend` and the :mod:`.zygote` process).

* zygote -> daemon, over a ``SOCK_SEQPACKET`` pair: one JSON message per packet
  (:func:`send_packet`), the ``standby`` message carrying descriptors with ``SCM_RIGHTS``
  (:data:`FDS1`/:data:`FDS2`: the daemon's end of the worker socket, and the worker's pidfd).
* daemon -> zygote: fixed-size binary control messages (:data:`CTRL`: kind, pid, memory,
  cpus, pids; kinds ``t`` took, ``u`` a probe took, ``k`` kill, ``i`` idle, ``p``
  ping).
* daemon -> worker: one request as ``length + JSON`` (:data:`HEADER`, :func:`recv_msg`);
  worker -> daemon: :mod:`sandboxd.protocol.wire` frames.
"""

from __future__ import annotations

import _socket
import json
import os
import socket
import struct
from typing import Any

from sandboxd.protocol.limits import Limits

HEADER = struct.Struct("!I")
#: daemon -> zygote control message: kind (b"t" took, b"u" a probe took, b"k" kill, b"i" idle,
#: b"p" ping), pid, memory, cpus, pids
CTRL = struct.Struct("!cIQdI")
FDS1, FDS2 = struct.Struct("i"), struct.Struct("ii")  # SCM_RIGHTS payloads
#: standby workers kept while idle: from start-up to the first call, and again once no call
#: took one for IDLE_AFTER_S seconds (the daemon sends ``i`` and kills the others); a call
#: (``t``) raises the zygote's target to the full count. Each standby is memory the idle
#: daemon keeps, so an idle one keeps few
IDLE_STANDBY = 1
IDLE_AFTER_S = 30.0


def cgroup_limits(limits: Limits) -> tuple[int, float, int]:
    """What a ``t`` (took) message carries for the worker's cgroup: memory, CPU share,
    pids (:data:`CTRL`'s last three fields, in this order)."""
    return limits.memory_bytes, limits.cpus, limits.pids


def send_packet(sock: socket.socket, msg: dict[str, Any], fds: list[int] | None = None) -> None:
    """One JSON message on a SOCK_SEQPACKET socket, optionally with descriptors."""
    data = json.dumps(msg).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def recv_buffer(sock: _socket.socket, n: int, use_read: bool = False) -> bytearray:
    """``n`` bytes from a stream socket, read straight into one buffer (a fork's state, tens
    of MB: one copy, where chunks joined would be two and a page fault per fresh page);
    ``use_read``: with ``read(2)``, for a confined worker whose seccomp filter denies
    ``recvfrom``."""
    buf = bytearray(n)
    fd = sock.fileno()
    with memoryview(buf) as view:
        got = 0
        while got < n:
            want = min(n - got, 1 << 20)
            if use_read:
                chunk = os.read(fd, want)
                view[got : got + len(chunk)] = chunk
                k = len(chunk)
            else:
                k = sock.recv_into(view[got:], want)
            if not k:
                raise EOFError
            got += k
    return buf


def recv_msg(sock: _socket.socket, use_read: bool = False) -> dict[str, Any]:
    """Length-prefixed JSON from a stream socket. Plain ``recv``/``read``: descriptors (nobody
    sends any) would be discarded by the kernel, never installed in this process."""
    (size,) = HEADER.unpack(recv_buffer(sock, HEADER.size, use_read))
    msg: dict[str, Any] = json.loads(recv_buffer(sock, size, use_read))
    return msg


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
