"""Host side of the in-container runner channel (see ``images/runner/sandboxd_runner/``).

Each container gets a private host directory, bind-mounted read-only at ``/run/sandboxd``,
holding a 32-byte key file and a unix socket the daemon listens on. The runner is the
container's first process: before any user code exists it reads the key, connects once and
says hello with it (``h`` frame). The daemon accepts connections one at a time (backlog 1),
authenticates the first hello that carries the key, then closes the listening socket and
unlinks the socket and the key: from then on nothing in the container can connect again or
read the key (the runner also makes itself non-dumpable, so same-uid code cannot read its
memory through ``/proc``). That one channel carries every call of the container,
multiplexed by call id (:mod:`sandboxd.protocol.wire` frames):

  daemon -> runner  ``R`` JSON request (a new call id; a session's python call names the
                    container's kernel, ``kernel_stop`` ends it), ``K`` stop that call,
                    ``I`` interrupt that call (a kernel call: SIGINT first, killed after the
                    request's ``interrupt_grace_s`` unless the kernel is back and idle)
  runner -> daemon  ``o``/``e`` output (at most :data:`sandboxd.protocol.wire.READ_BYTES` each),
                    ``d`` a display item (:mod:`sandboxd.protocol.display`, checked by
                    :mod:`sandboxd.results.outputs` against the call's caps),
                    ``x`` JSON exit record (ends the call)

The channel is read as an attacker's writes: a bounded decoder (known kinds, sizes checked at
the header), bounded reads, output capped per call, the exit record validated; frames for a
call that is not running, unknown kinds or sizes, or a malformed record break the channel
(every call on it fails with :class:`RunnerLost`; the backend then removes the container).
Slow or silent peers are the caller's deadline's business (and the hello's timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path

from sandboxd.backends.stdin import Stdin
from sandboxd.errors import SandboxdError
from sandboxd.protocol import wire
from sandboxd.protocol.call import WorkerReport, WorkerRequest
from sandboxd.protocol.display import DisplayCaps
from sandboxd.results.items import Position
from sandboxd.results.outputs import DisplayCollector
from sandboxd.results.streaming import EventSink, StreamKind, TextRelay, emit
from sandboxd.util.deadline import stop_task, within
from sandboxd.workspaces import fstree

SOCKET_NAME = "runner.sock"
KEY_NAME = "key"
KEY_BYTES = 32
HELLO_TIMEOUT_S = 5.0
SUSPEND_TIMEOUT_S = 5.0
MAX_BAD_PEERS = 4  # connections without the key before the endpoint gives up
MAX_EXIT_RECORD = 4 * 1024 * 1024  # the value (<= ~2 MiB of JSON) and a few counters
MAX_DISPLAY_FRAME = 64 * 1024 * 1024  # any call's; each call's own cap is checked per frame
SIZES = {
    b"o": (1, wire.READ_BYTES),
    b"e": (1, wire.READ_BYTES),
    b"d": (2, MAX_DISPLAY_FRAME),
    b"x": (2, MAX_EXIT_RECORD),
}


class RunnerLost(SandboxdError, RuntimeError):
    """The runner went away, broke the protocol, or never authenticated."""

    code = "runner-lost"


def check_exit_record(payload: bytes) -> WorkerReport:
    """The runner's exit record, validated: a :class:`~sandboxd.protocol.call.WorkerReport`
    (the one definition both sandboxes' reports are decoded with; raises
    :class:`sandboxd.protocol.wire.ProtocolError`)."""
    try:
        return WorkerReport.from_wire(json.loads(payload))
    except RecursionError:
        raise wire.ProtocolError("the exit record is not JSON (RecursionError)") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise wire.ProtocolError(f"the exit record is not valid: {str(exc)[:200]}") from None


@dataclass
class CallOutput:
    """What one call produced, as the runner reported it."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    last_stream: StreamKind = "stdout"
    exit: WorkerReport | None = None
    over_limit: bool = False
    displays: DisplayCollector = field(default_factory=lambda: DisplayCollector(DisplayCaps()))
    events: EventSink | None = None  # a streaming caller's sink (sandboxd.results.streaming)
    relay: TextRelay | None = None  # set by Channel.call: stdout/stderr to ``events``
    cid: int | None = None  # set by Channel.call: the call's id on the channel, once sent
    stdin: Stdin | None = None  # what its caller feeds its command's stdin (sent: ``i``, ``c``)


def _display(out: CallOutput, payload: bytes) -> None:
    """A display item of the call (a malformed one breaks the channel: ProtocolError),
    streamed where it happened in the call's output."""
    item = out.displays.take(payload)
    if item is not None:
        if out.relay is not None:  # where it happened, for order
            item.at = Position(**out.relay.position())
        emit(out.events, "display", item.model_dump(mode="json"))


@dataclass
class _Call:
    out: CallOutput
    cap: int
    done: asyncio.Future[None]


class Channel:
    """The one authenticated connection to a container's runner, shared by its calls."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = wire.Decoder(SIZES)
        self.calls: dict[int, _Call] = {}
        self.ended: set[int] = set()  # calls stopped here: their late frames are dropped
        self.next_id = 1
        self.broken: str | None = None
        self.task = asyncio.create_task(self._read_loop(), name="runner-channel")

    async def _read_loop(self) -> None:
        why = "the sandbox runner went away"
        try:
            while True:
                data = await self.reader.read(wire.READ_BYTES)
                if not data:
                    break
                for frame in self.decoder.feed(data):
                    self._dispatch(frame)
        except wire.ProtocolError as exc:
            why = f"the sandbox runner broke the channel protocol ({exc})"
        except (ConnectionError, OSError) as exc:
            why = f"the sandbox runner went away ({type(exc).__name__})"
        except asyncio.CancelledError:
            why = "the sandbox container was removed"
        self._break(why)

    def _dispatch(self, frame: wire.Frame) -> None:
        call = self.calls.get(frame.call)
        if call is None:
            if frame.call in self.ended:
                return
            raise wire.ProtocolError(f"a frame for call {frame.call}, which is not running")
        if frame.kind == b"x":
            call.out.exit = check_exit_record(frame.payload)
            self._end(frame.call)
        elif frame.kind == b"d":
            _display(call.out, frame.payload)
        else:
            self._output(frame, call)

    def _output(self, frame: wire.Frame, call: _Call) -> None:
        """A chunk of the call's stdout (``o``) or stderr: kept within the call's cap; past
        it, the call is stopped."""
        out = call.out
        target = out.stdout if frame.kind == b"o" else out.stderr
        out.last_stream = "stdout" if frame.kind == b"o" else "stderr"
        room = call.cap - len(out.stdout) - len(out.stderr)
        if out.relay is not None:
            out.relay.feed(out.last_stream, frame.payload)  # (within the cap)
        if len(frame.payload) > room:  # the runner enforces the cap too; never trust it alone
            target += frame.payload[: max(room, 0)]
            out.over_limit = True
            self.stop(frame.call)
            return
        target += frame.payload

    def _end(self, cid: int, exc: BaseException | None = None) -> None:
        call = self.calls.pop(cid, None)
        self.ended.add(cid)
        if call is not None and not call.done.done():
            if exc is None:
                call.done.set_result(None)
            else:
                call.done.set_exception(exc)
                call.done.exception()  # retrieved by the caller, or nobody waits any more

    def _break(self, why: str) -> None:
        if self.broken is None:
            self.broken = why
        for cid in list(self.calls):
            self._end(cid, RunnerLost(self.broken))
        self.writer.close()

    def interrupt(self, cid: int) -> bool:
        """Ask the runner to interrupt a call in flight (``I``); its exit record (or a
        :meth:`stop`) ends it as usual. False when the call is not running here."""
        if cid not in self.calls or self.broken is not None or self.writer.is_closing():
            return False
        self.writer.write(wire.encode(b"I", b"", cid))
        return True

    def send_stdin(self, cid: int, chunk: bytes | None) -> None:
        """A chunk of a running command's stdin (``i``), or its end (None: ``c``); nothing
        once the call ended here (its command cannot read any more)."""
        if cid in self.calls and self.broken is None and not self.writer.is_closing():
            self.writer.write(wire.encode(b"c", b"", cid) if chunk is None
                              else wire.encode(b"i", chunk, cid))

    def stop(self, cid: int) -> None:
        """Stop a call here and ask the runner to kill its processes (``K``)."""
        if cid in self.calls:
            self._end(cid)
            if self.broken is None and not self.writer.is_closing():
                self.writer.write(wire.encode(b"K", b"", cid))

    async def call(self, request: WorkerRequest, output_bytes: int, out: CallOutput) -> None:
        """Send ``request`` as a new call and collect its frames into ``out`` until its exit
        record or the output cap. Raises :class:`RunnerLost`; the caller owns timeouts
        (cancelling this stops the call in the runner)."""
        if self.broken is not None:
            raise RunnerLost(self.broken)
        cid, self.next_id = self.next_id, self.next_id + 1
        out.cid = cid
        out.relay = TextRelay(out.events, output_bytes)
        done = asyncio.get_running_loop().create_future()
        self.calls[cid] = _Call(out, output_bytes, done)
        try:
            self.writer.write(wire.encode(b"R", json.dumps(request.to_wire()).encode(), cid))
            if out.stdin is not None:
                out.stdin.attach(lambda chunk: self.send_stdin(cid, chunk))
            await self.writer.drain()
            await done
        except (ConnectionError, OSError) as exc:
            raise RunnerLost(f"the sandbox runner went away ({type(exc).__name__})") from exc
        finally:
            self.stop(cid)
            out.relay.close()

    async def suspend(self, key: bytes) -> bool:
        """Tell the runner that the daemon stops and keeps its session (a ``suspend``
        request, so that a restart does not end the session): when the channel closes it
        keeps its kernel and reconnects to the next daemon with ``key`` (once). True once it said
        so; False when it did not within :data:`SUSPEND_TIMEOUT_S` (a runner that predates this
        answers otherwise)."""
        if self.calls:
            return False
        out = CallOutput()
        done, _ = await within(self.call(WorkerRequest.suspend(key), 0, out),
                               SUSPEND_TIMEOUT_S)
        return done and out.exit is not None and out.exit.message == "suspended"

    async def close(self) -> None:
        await stop_task(self.task)
        self.writer.close()


#: the longest path ``bind(2)`` takes for a unix socket (``sun_path`` is 108 bytes with its NUL)
SUN_PATH_MAX = 107


def bind_unix(sock: socket.socket, path: Path) -> None:
    """Bind ``sock`` at ``path`` through a descriptor of its directory
    (``/proc/self/fd/N/name``). The kernel records the address exactly as given, and every
    connection accepted on the socket carries it into the *connecting* side's network
    namespace: a container lists it in its own ``/proc/net/unix`` for as long as its channel
    lives. So the address names no host path (the state directory), only a descriptor number
    of the daemon; and a path of any length works (past :data:`SUN_PATH_MAX` too), so that the
    socket is made where it belongs (below the state directory, swept by the next start)."""
    dfd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        sock.bind(f"/proc/self/fd/{dfd}/{path.name}")
    finally:
        os.close(dfd)


@dataclass(eq=False)
class Endpoint:
    """A container's runner endpoint: the key, the one-shot listener, then the channel."""

    rundir: Path
    key: bytes
    listener: socket.socket | None = None
    channel: Channel | None = None
    failure: str | None = None
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    closing: bool = False

    @classmethod
    async def open(cls, rundir: Path, owner: tuple[int, int] | None) -> Endpoint:
        """Create ``rundir`` with the key and the listening socket; start waiting for the
        runner. With ``owner`` (the daemon is root) both belong to the sandbox user and are
        private to it; otherwise they are world-accessible inside a parent directory only the
        daemon can enter."""
        rundir.mkdir(mode=0o700, parents=False, exist_ok=False)
        ep = cls(rundir, secrets.token_bytes(KEY_BYTES))
        key_path, sock_path = rundir / KEY_NAME, rundir / SOCKET_NAME
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        try:
            os.write(fd, ep.key)
        finally:
            os.close(fd)
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lsock.setblocking(False)
        bind_unix(lsock, sock_path)
        lsock.listen(1)  # one peer at a time waits; more are refused by the kernel
        ep.listener = lsock
        if owner is not None:
            # chmod while root still owns them: after the chown, changing the mode needs
            # CAP_FOWNER, which the hardened unit does not keep.
            os.chmod(sock_path, 0o600)
            os.chmod(rundir, 0o500)
            for path in (sock_path, key_path, rundir):
                os.chown(path, *owner)
        else:
            os.chmod(sock_path, 0o666)
            os.chmod(key_path, 0o444)
            os.chmod(rundir, 0o755)
        ep.task = asyncio.create_task(ep._establish(), name="runner-endpoint")
        return ep

    @classmethod
    async def resume(cls, rundir: Path, key: bytes, owner: tuple[int, int] | None) -> Endpoint:
        """Listen again in a kept container's ``rundir`` (a restarted daemon) for
        its runner, which reconnects with the one-time ``key`` it was given at the stop."""
        ep = cls(rundir, key)
        sock_path = rundir / SOCKET_NAME
        with contextlib.suppress(FileNotFoundError):
            sock_path.unlink()
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lsock.setblocking(False)
            bind_unix(lsock, sock_path)
            lsock.listen(1)
            os.chmod(sock_path, 0o600 if owner is not None else 0o666)
            if owner is not None:
                os.chown(sock_path, *owner)
        except BaseException:
            lsock.close()
            raise
        ep.listener = lsock
        ep.task = asyncio.create_task(ep._establish(), name="runner-endpoint")
        return ep

    async def _establish(self) -> None:
        loop = asyncio.get_running_loop()
        bad = 0
        try:
            while self.listener is not None and not self.closing:
                conn, _ = await loop.sock_accept(self.listener)
                try:
                    # within, not wait_for: on 3.11 wait_for can swallow close()'s cancel
                    # when the hello ends at that moment, and this loop then waits forever
                    answered, ok = await within(self._hello(conn), HELLO_TIMEOUT_S)
                    ok = answered and ok
                except (OSError, wire.ProtocolError):
                    ok = False
                if ok and not self.closing:
                    self._unlisten()
                    reader, writer = await asyncio.open_unix_connection(
                        sock=conn, limit=wire.READ_BYTES)
                    self.channel = Channel(reader, writer)
                    return
                conn.close()
                bad += 1
                if bad >= MAX_BAD_PEERS:
                    self.failure = f"{bad} connections to the runner socket without its key"
                    return
        finally:
            self._unlisten()
            if self.channel is None and self.failure is None:
                self.failure = "the sandbox runner did not connect"
            self.settled.set()

    async def _hello(self, conn: socket.socket) -> bool:
        """Read exactly one hello frame (nothing more) and check its key."""
        loop = asyncio.get_running_loop()
        decoder = wire.Decoder({b"h": (KEY_BYTES, KEY_BYTES)}, max_frames=1)
        need = wire.HEADER.size + KEY_BYTES
        while need:
            data = await loop.sock_recv(conn, need)
            if not data:
                return False
            need -= len(data)
            for frame in decoder.feed(data):
                return frame.call == 0 and hmac.compare_digest(frame.payload, self.key)
        return False

    def _unlisten(self) -> None:
        """Close the listening socket and remove it and the key: no second connection."""
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        for name in (SOCKET_NAME, KEY_NAME):
            with contextlib.suppress(OSError):
                (self.rundir / name).unlink()

    @property
    def ready(self) -> bool:
        return self.channel is not None and self.channel.broken is None

    async def close(self, *, keep_dir: bool = False) -> None:
        """Stop listening, hang up the channel, remove the directory (``keep_dir``: a kept
        container's, which its runner reconnects through)."""
        self.closing = True
        await stop_task(self.task)
        self._unlisten()
        if self.channel is not None:
            await self.channel.close()
        if not keep_dir:
            fstree.remove_tree_quietly(self.rundir)
