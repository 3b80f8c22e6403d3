"""A command's standard input, fed by an in-process caller while the command runs (the E2B
door's ``send_stdin`` and ``close_stdin``).

The caller makes a :class:`Stdin` and starts the call with :func:`feeding` in effect; a
backend that can serve it (the container backend: a pipe as the command's stdin, fed by the
runner channel's ``i`` and ``c`` frames) finds it with :func:`requested` and connects it
with :meth:`Stdin.attach` once the command is with its runner. Every other call's stdin stays
``/dev/null``. What is written before the command started waits here, within the same bound
as the rest: at most :data:`~sandboxd.protocol.limits.MAX_STDIN_BYTES` over the command's
life, checked whole before any of a write is sent.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable

from sandboxd.protocol import wire
from sandboxd.protocol.limits import MAX_STDIN_BYTES

#: the stdin of the call started in this context, if its caller feeds one
_FEED: contextvars.ContextVar[Stdin | None] = contextvars.ContextVar("sandboxd_stdin",
                                                                     default=None)


class StdinRefused(ValueError):
    """A write the command's stdin does not take: closed, or over the bound."""


class Stdin:
    """One command's stdin: written by its caller, sent to where the command runs."""

    def __init__(self) -> None:
        self.total = 0
        self.closed = False
        self.attached = asyncio.Event()
        self._pending: list[bytes | None] = []  # before the command runs (None: the close)
        self._send: Callable[[bytes | None], None] | None = None

    def write(self, data: bytes) -> None:
        """Send ``data`` (in frames of at most ``wire.READ_BYTES``); raises
        :class:`StdinRefused` when closed or when it would pass the bound."""
        if self.closed:
            raise StdinRefused("the command's stdin is closed")
        if self.total + len(data) > MAX_STDIN_BYTES:
            raise StdinRefused(f"a command's stdin takes at most {MAX_STDIN_BYTES} bytes "
                               f"in all ({self.total} sent, {len(data)} more asked)")
        self.total += len(data)
        for at in range(0, len(data), wire.READ_BYTES):
            self._put(data[at:at + wire.READ_BYTES])

    def close(self) -> None:
        """End of input (the command reads EOF once it read what was sent)."""
        if not self.closed:
            self.closed = True
            self._put(None)

    def attach(self, send: Callable[[bytes | None], None]) -> None:
        """The command runs: ``send`` delivers a chunk (None: the close) from now on, and
        what was written before goes first."""
        self._send = send
        pending, self._pending = self._pending, []
        for chunk in pending:
            send(chunk)
        self.attached.set()

    def _put(self, chunk: bytes | None) -> None:
        if self._send is None:
            self._pending.append(chunk)
        else:
            self._send(chunk)


def feeding(stdin: Stdin) -> contextvars.Context:
    """A context in which a call started (``asyncio.create_task(..., context=...)``) has
    ``stdin`` as its command's stdin."""
    context = contextvars.copy_context()
    context.run(_FEED.set, stdin)
    return context


def requested() -> Stdin | None:
    """The stdin the current call's caller feeds, if any."""
    return _FEED.get()
