"""A tiny ``sd_notify(3)``: tell systemd (``Type=notify``) that the daemon is ready or stopping.

The protocol is one datagram of ``KEY=value`` lines sent to the ``AF_UNIX`` socket named by
``$NOTIFY_SOCKET`` (a path, or ``@name`` for an abstract socket). Without ``$NOTIFY_SOCKET``
(not started by systemd) every function here is a no-op that returns ``False``. A failure to
send is logged and swallowed: notification must never take the daemon down.

Usage::

    from sandboxd.health.notify import notify
    notify("READY=1\nSTATUS=serving")   # after the self-test passed
    notify("STOPPING=1")                 # on SIGTERM, before draining
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)

ENV_SOCKET = "NOTIFY_SOCKET"


def _address(raw: str) -> str | bytes:
    """The socket address: abstract sockets start with ``@`` (a NUL byte on the wire)."""
    if raw.startswith("@"):
        return b"\0" + raw[1:].encode()
    return raw


def _datagram(fields: tuple[str, ...]) -> bytes:
    """The datagram of ``fields``: their non-empty lines, each ``KEY=value`` (else
    :class:`ValueError`)."""
    lines = [line for field in fields for line in field.split("\n") if line]
    for line in lines:
        if "=" not in line:
            raise ValueError(f"invalid sd_notify field {line!r}: expected KEY=value")
    return "\n".join(lines).encode()


def notify(*fields: str, unset_environment: bool = False) -> bool:
    """Send ``fields`` (e.g. ``"READY=1"``, ``"STATUS=..."``) to systemd.

    A field may hold several newline-separated ``KEY=value`` lines (``"READY=1\\nSTATUS=up"``).

    Returns ``True`` when a datagram was sent, ``False`` when there is no notify socket or the
    send failed. ``unset_environment`` removes ``$NOTIFY_SOCKET`` afterwards (children must not
    inherit it).
    """
    raw = os.environ.get(ENV_SOCKET, "")
    if unset_environment:
        os.environ.pop(ENV_SOCKET, None)
    if not raw or not fields:
        return False
    if not raw.startswith(("/", "@")):
        log.warning("ignoring NOTIFY_SOCKET=%r: not a path or an abstract socket name", raw)
        return False
    message = _datagram(fields)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(_address(raw))
            sock.sendall(message)
    except OSError as exc:
        log.warning("sd_notify to %s failed: %s", raw, exc)
        return False
    return True

