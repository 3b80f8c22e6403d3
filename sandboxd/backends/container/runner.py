"""Host side of the in-container runner protocol (see ``images/runner/sandboxd-runner.py``).

Each container gets a private host directory, bind-mounted read-only at ``/run/sandboxd``,
holding a unix socket the daemon listens on. The runner inside connects, says hello, and waits
for a request; it forks a handler per request and reconnects at once, so the daemon keeps a
queue of idle connections per container. Nothing goes over the network.

Frames: 1 byte type, 4 bytes big-endian length, payload (``R`` request, ``h`` hello,
``o``/``e`` output, ``x`` exit record).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEADER = struct.Struct(">cI")
SOCKET_NAME = "runner.sock"
MAX_FRAME = 16 * 1024 * 1024


class RunnerLost(RuntimeError):
    """The runner (or the call's handler) went away without an exit record."""


def frame(kind: bytes, payload: bytes) -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readexactly(HEADER.size)
    kind, size = HEADER.unpack(head)
    if size > MAX_FRAME:
        raise RunnerLost(f"oversized frame from the runner ({size} bytes)")
    return kind, await reader.readexactly(size)


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass
class Endpoint:
    """The listening socket of one container and its queue of idle runner connections."""

    rundir: Path
    server: asyncio.AbstractServer | None = None
    idle: asyncio.Queue[Conn] = field(default_factory=asyncio.Queue)
    connections: set[asyncio.StreamWriter] = field(default_factory=set)
    hello: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    async def open(cls, rundir: Path, owner: tuple[int, int] | None) -> Endpoint:
        """Create ``rundir`` and listen on ``rundir/runner.sock``.

        With ``owner`` (the daemon is root) the directory and socket belong to the sandbox
        user and are private to it; otherwise they are world-accessible inside a parent
        directory only the daemon can enter.
        """
        rundir.mkdir(mode=0o700, parents=False, exist_ok=False)
        ep = cls(rundir)
        path = rundir / SOCKET_NAME
        ep.server = await asyncio.start_unix_server(ep._accept, path=str(path))
        if owner is not None:
            # chmod while root still owns them: after the chown, changing the mode needs
            # CAP_FOWNER, which the hardened unit does not keep.
            os.chmod(path, 0o600)
            os.chmod(rundir, 0o500)
            os.chown(path, *owner)
            os.chown(rundir, *owner)
        else:
            os.chmod(path, 0o666)
            os.chmod(rundir, 0o755)
        return ep

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.add(writer)
        try:
            kind, _ = await asyncio.wait_for(read_frame(reader), 30)
        except (Exception, asyncio.CancelledError):
            self._drop(writer)
            return
        if kind != b"h":
            self._drop(writer)
            return
        self.hello.set()
        self.idle.put_nowait((reader, writer))

    def _drop(self, writer: asyncio.StreamWriter) -> None:
        self.connections.discard(writer)
        with contextlib.suppress(Exception):
            writer.close()

    @property
    def ready(self) -> bool:
        return not self.idle.empty()

    async def take(self) -> Conn:
        """The next idle runner connection (waits for the runner to connect)."""
        while True:
            reader, writer = await self.idle.get()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer
            self._drop(writer)

    def give_back(self, conn: Conn) -> None:
        """Return an idle connection that was taken but not used (a cancelled wait)."""
        self.idle.put_nowait(conn)

    def release(self, writer: asyncio.StreamWriter) -> None:
        """Close a connection used by a call (the handler then stops its worker)."""
        self._drop(writer)

    async def close(self) -> None:
        """Stop listening, hang up every connection, remove the directory."""
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2)
            self.server = None
        for writer in list(self.connections):
            self._drop(writer)
        while not self.idle.empty():
            self.idle.get_nowait()
        shutil.rmtree(self.rundir, ignore_errors=True)


@dataclass
class CallOutput:
    """What one call produced, as the runner reported it."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    last_stream: str = "stdout"
    exit: dict[str, Any] | None = None
    over_limit: bool = False


async def call(conn: Conn, request: dict[str, Any], output_bytes: int, out: CallOutput) -> None:
    """Send ``request`` on ``conn`` and collect frames into ``out`` until the exit record.

    Raises :class:`RunnerLost` when the connection ends first. The caller owns timeouts
    (cancel this coroutine) and closes the connection afterwards.
    """
    reader, writer = conn
    writer.write(frame(b"R", json.dumps(request).encode()))
    try:
        await writer.drain()
        while True:
            kind, body = await read_frame(reader)
            if kind == b"x":
                out.exit = json.loads(body)
                return
            if kind in (b"o", b"e"):
                target = out.stdout if kind == b"o" else out.stderr
                out.last_stream = "stdout" if kind == b"o" else "stderr"
                room = output_bytes - len(out.stdout) - len(out.stderr)
                if len(body) > room:  # the runner enforces the cap too; never trust it alone
                    target += body[: max(room, 0)]
                    out.over_limit = True
                    return
                target += body
    except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
        raise RunnerLost(f"the sandbox runner went away ({type(exc).__name__})") from exc
