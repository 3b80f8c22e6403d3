"""The egress proxy: one unix socket per sandbox container, served by the daemon.

A sandbox with egress has no network at all (Docker's ``none``: loopback only). Its
container's runner directory holds ``egress.sock``, a socket of this proxy made for that
container alone; a small forwarder in the sandbox (:mod:`sandboxd.egress.forwarder`) offers it
on ``127.0.0.1:3128`` for ``HTTP_PROXY``/``HTTPS_PROXY``. So the proxy knows the sandbox from
the socket the connection arrived on (the network identity: nothing the sandbox sends can
change it), and every byte that leaves the sandbox goes through :meth:`EgressProxy._serve`:
CONNECT (TLS, its server name must be the CONNECT host) and plain ``http://`` requests (one per
connection, Host header = URL host), each checked by :mod:`sandboxd.egress.decide`, resolved
here, connected only to an address resolved for the allowed name, and audited.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxd.egress.decide import Verdict, check_address, check_target, same_host
from sandboxd.egress.resolve import ResolveError, Resolver
from sandboxd.egress.rules import EgressRules, ip_literal
from sandboxd.egress.terminate import terminate
from sandboxd.egress.tls import DaemonCA, upstream_context
from sandboxd.egress.wire import (
    CONNECT_TIMEOUT_S,
    HEAD_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    MAX_HEAD_BYTES,
    BadRequest,
    Head,
    body_length,
    client_hello_sni,
    parse_head,
    record_length,
    refusal,
    upstream_head,
)
from sandboxd.util.deadline import bounded

log = logging.getLogger("sandboxd.egress")

MAX_CONNECTIONS = 64  # per sandbox
READY_LINE = b"SANDBOXD-EGRESS-FORWARDER READY\r\n\r\n"
SOCKET_NAME = "egress.sock"
#: the verdict a connection's record states when no request head was ever judged
MALFORMED = Verdict(False, "egress (malformed request)")

Sink = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(eq=False)
class Identity:
    """The sandbox a proxy socket belongs to; ``rules`` follow its latest call's policy."""

    box: str
    client: str
    session: str | None
    rules: EgressRules
    tool: str = ""  # the tool of its latest call (a reload recomputes its rules)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    open: set[Conn] = field(default_factory=set)
    server: asyncio.AbstractServer | None = None


@dataclass(eq=False)
class Conn:
    """One connection attempt: what the audit record says about it."""

    ident: Identity
    writer: asyncio.StreamWriter
    started: float = field(default_factory=time.monotonic)
    method: str | None = None
    host: str | None = None
    port: int | None = None
    path: str | None = None
    address: str | None = None
    sent: int = 0  # bytes from the sandbox to the server
    received: int = 0
    verdict: Verdict | None = None
    upstream: asyncio.StreamWriter | None = None
    cut: str | None = None  # why the daemon closed it (a reload)

    def refusal_under(self, rules: EgressRules) -> str | None:
        """Why ``rules`` would refuse this connection's judged target (``None``: they allow
        it, or it was never judged)."""
        if self.host is None or self.port is None or self.verdict is None:
            return None
        again = check_target(rules, self.host, self.port, self.method or "",
                             self.path if self.method != "CONNECT" else None)
        return None if again.allowed else again.reason

    def close(self) -> None:
        """Close the sandbox's side and the server's, when there is one."""
        _close(self.writer)
        if self.upstream is not None:
            _close(self.upstream)

    def record(self) -> dict[str, Any]:
        """The connection's audit record (the verdict's reason and a cut when there are)."""
        v = self.verdict or MALFORMED
        out: dict[str, Any] = {
            "sandbox": self.ident.box, "client": self.ident.client,
            "session": self.ident.session, "policy": self.ident.rules.policy,
            "method": self.method, "host": _clip(self.host, 255), "port": self.port,
            "path": _clip(self.path, 512), "address": self.address,
            "bytes_out": self.sent, "bytes_in": self.received,
            "verdict": "allowed" if v.allowed else "denied", "rule": v.rule,
            "duration_ms": round((time.monotonic() - self.started) * 1000, 1)}
        if v.reason:
            out["reason"] = v.reason
        if self.cut:
            out["cut"] = self.cut
        return out


def _clip(text: str | None, limit: int) -> str | None:
    """``text`` cut to ``limit`` characters for the record; None for none or empty."""
    return (text or "")[:limit] or None


class EgressProxy:
    """The daemon's egress proxy: :meth:`attach` a socket per sandbox, :meth:`detach` it."""

    def __init__(self, resolver: Resolver | None = None, sink: Sink | None = None, *,
                 ca_dir: Path | None = None, upstream_ca: Path | None = None) -> None:
        self.resolver = resolver or Resolver()
        self.sink = sink
        self.identities: set[Identity] = set()
        self.ca_dir = ca_dir
        self.ca: DaemonCA | None = None  # made or loaded by the first sandbox with secrets
        self.upstream_tls = upstream_context(upstream_ca)

    def ensure_ca(self) -> DaemonCA:
        """The daemon's CA (its key never leaves ``ca_dir``)."""
        if self.ca is None:
            if self.ca_dir is None:
                raise RuntimeError("the egress proxy has no directory for its CA")
            self.ca = DaemonCA.load_or_make(self.ca_dir)
        return self.ca

    async def attach(self, directory: Path, uid: int | None, ident: Identity) -> Path:
        """Listen on ``directory/egress.sock`` for ``ident`` (owned by the sandbox's uid so
        that it may connect, and by nobody else)."""
        path = directory / SOCKET_NAME
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            dfd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                sock.bind(f"/proc/self/fd/{dfd}/{SOCKET_NAME}")
            finally:
                os.close(dfd)
            if uid is not None:
                os.chown(path, uid, uid, follow_symlinks=False)
            os.chmod(path, 0o600)
            ident.server = await asyncio.start_unix_server(
                lambda r, w: self._serve(ident, r, w), sock=sock, limit=MAX_HEAD_BYTES)
        except BaseException:
            sock.close()
            raise
        self.identities.add(ident)
        return path

    async def detach(self, ident: Identity) -> None:
        """Stop listening for ``ident`` and close its connections."""
        self.identities.discard(ident)
        if ident.server is not None:
            ident.server.close()
        for conn in list(ident.open):
            conn.close()

    def update(self, ident: Identity, rules: EgressRules) -> int:
        """New rules for ``ident`` (a call under a reloaded policy): new connections follow
        them at once; open ones whose target they no longer allow are cut. Returns how many."""
        ident.rules = rules
        cut = 0
        for conn in list(ident.open):
            why = conn.refusal_under(rules)
            if why is not None and conn.upstream is not None:
                conn.cut = f"the policy no longer allows it: {why}"
                conn.close()
                cut += 1
        return cut

    async def _audit(self, conn: Conn) -> None:
        if self.sink is None:
            return
        try:
            await self.sink(conn.record())
        except Exception as exc:  # the audit module logs and flags its own failures
            log.error("egress audit record failed: %s", exc)

    async def _serve(self, ident: Identity, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        conn = Conn(ident, writer)
        if len(ident.open) >= MAX_CONNECTIONS:
            conn.verdict = Verdict(False, "egress (connections)",
                                   f"more than {MAX_CONNECTIONS} connections at once")
            await _refuse(writer, conn.verdict, 503)
            await self._audit(conn)
            return
        ident.open.add(conn)
        try:
            await self._handle(conn, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, OSError):
            pass
        finally:
            ident.open.discard(conn)
            conn.close()
            if conn.method is not None or conn.verdict is not None:
                await self._audit(conn)

    async def _handle(self, conn: Conn, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        """One connection: its request head read and judged, then tunnelled or forwarded;
        refused (and the refusal answered) when it is not allowed."""
        request = await self._request(conn, reader, writer)
        if request is None:
            return
        head, length = request
        conn.method, conn.host, conn.port = head.method, head.host, head.port
        conn.path = head.path or None
        verdict = conn.verdict = await self._judge(conn, head)
        if not verdict.allowed:
            await _refuse(writer, verdict)
        elif head.method == "CONNECT":
            await self._tunnel(conn, reader, writer)
        else:
            await self._forward(conn, reader, writer, head, length)

    async def _request(self, conn: Conn, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> tuple[Head, int] | None:
        """The connection's request head and how many body bytes follow it (a CONNECT: 0);
        None when there is none to judge: the forwarder's ready line, or a head too large,
        too slow or malformed (``conn.verdict`` says which)."""
        try:
            data = await bounded(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            conn.verdict = Verdict(False, "egress (request head)", "request head too large")
            await _refuse(writer, conn.verdict, 400)
            return None
        except TimeoutError:
            conn.verdict = Verdict(False, "egress (request head)",
                                   f"no complete request head within {HEAD_TIMEOUT_S:g} s")
            return None
        if data == READY_LINE:
            conn.ident.ready.set()
            return None
        try:
            head = parse_head(data[:-4])
            return head, body_length(head) if head.method != "CONNECT" else 0
        except BadRequest as exc:
            conn.verdict = Verdict(False, "egress (request head)", str(exc))
            await _refuse(writer, conn.verdict, 400)
            return None

    async def _judge(self, conn: Conn, head: Head) -> Verdict:
        """The verdict on a request: its target under the sandbox's rules, a plain request's
        Host header naming that target, then an address its name resolves to."""
        tunnel = head.method == "CONNECT"
        rules = conn.ident.rules
        verdict = check_target(rules, head.host, head.port, head.method,
                               None if tunnel else head.path)
        if not verdict.allowed:
            return verdict
        if not tunnel and not same_host(head.host, head.header("host")):
            return Verdict(False, verdict.rule, f"the Host header {head.header('host')!r}"
                           f" does not name the requested host {head.host}")
        return await self._address(conn, rules, head) or verdict

    async def _address(self, conn: Conn, rules: EgressRules, head: Head) -> Verdict | None:
        """Resolve the allowed name (an allowed IP literal is its own address); a refusal
        when no answer may be connected to."""
        literal = ip_literal(head.host)
        if literal is not None:
            conn.address = str(literal)
            return None
        try:
            answers = await self.resolver.resolve(head.host)
        except ResolveError as exc:
            return Verdict(False, "egress (resolve)", str(exc))
        addr, refused = check_address(rules, head.host, head.port, answers)
        conn.address = str(addr) if addr is not None else None
        return refused

    async def _open(self, conn: Conn) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        assert conn.address is not None and conn.port is not None
        up_r, up_w = await bounded(asyncio.open_connection(conn.address, conn.port),
                                   CONNECT_TIMEOUT_S)
        conn.upstream = up_w
        return up_r, up_w

    async def _tunnel(self, conn: Conn, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        """CONNECT: the tunnel must start with a TLS ClientHello naming the CONNECT host
        (an IP rule's tunnel may name none); then bytes both ways."""
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        size, hello = await bounded(_read_hello(reader), HEAD_TIMEOUT_S)
        assert conn.host is not None and conn.verdict is not None
        problem = _hello_problem(conn.host, size, hello)
        if problem is not None:
            conn.verdict = Verdict(False, conn.verdict.rule, problem)
            return
        spec = conn.ident.rules.secret_for(conn.host)
        if spec is not None and self.ca is not None:
            await terminate(self, conn, reader, writer, hello, spec)
            return
        up_r, up_w = await self._open(conn)
        up_w.write(hello)
        conn.sent += len(hello)
        await self._relay(conn, reader, writer, up_r, up_w)

    async def _forward(self, conn: Conn, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter, head: Head, length: int) -> None:
        """Plain HTTP: the checked request to the origin in origin form, then the rest of
        the connection both ways (``Connection: close``: one request per connection)."""
        try:
            up_r, up_w = await self._open(conn)
        except (OSError, TimeoutError) as exc:
            conn.verdict = Verdict(False, "egress (upstream)", f"cannot connect: {exc}")
            await _refuse(writer, conn.verdict, 502)
            return
        out = upstream_head(head)
        up_w.write(out)
        conn.sent += len(out)
        await self._relay(conn, reader, writer, up_r, up_w, limit=length)

    async def _relay(self, conn: Conn, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter, up_r: asyncio.StreamReader,
                     up_w: asyncio.StreamWriter, limit: int | None = None) -> None:
        """Bytes both ways until both ends are done; ``limit``: how many the sandbox may
        still send (a plain request's body; None: a tunnel's, any)."""
        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                       outbound: bool, left: int | None = None) -> None:
            while left is None or left > 0:
                data = await bounded(
                    src.read(64 * 1024 if left is None else min(64 * 1024, left)),
                    IDLE_TIMEOUT_S)
                if not data:
                    break
                dst.write(data)
                await dst.drain()
                if left is not None:
                    left -= len(data)
                if outbound:
                    conn.sent += len(data)
                else:
                    conn.received += len(data)
            if left is not None:  # the body is complete: what the sandbox sends after it
                while await src.read(64 * 1024):  # goes nowhere; its end ends the relay
                    pass
                return
            with contextlib.suppress(OSError):
                if dst.can_write_eof():
                    dst.write_eof()

        tasks = [asyncio.ensure_future(pump(reader, up_w, True, limit)),
                 asyncio.ensure_future(pump(up_r, writer, False))]
        try:
            # a request ends when either side is done with it; a tunnel when both are
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED if limit is not None
                               else asyncio.FIRST_EXCEPTION)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task


async def _read_hello(reader: asyncio.StreamReader) -> tuple[int | None, bytes]:
    """A tunnel's first TLS record: its length (None: not a TLS handshake record) and its
    bytes (only the 5-byte record header when it is not one)."""
    first = await reader.readexactly(5)
    size = record_length(first)
    return size, first + (await reader.readexactly(size) if size is not None else b"")


def _hello_problem(host: str, size: int | None, hello: bytes) -> str | None:
    """Why a tunnel's first record may not go to the CONNECT ``host``: not a TLS
    ClientHello, or one naming another server (an IP host's may name none); None if it may."""
    if size is None:
        return "the tunnel does not start with a TLS ClientHello"
    try:
        sni = client_hello_sni(hello)
    except ValueError as exc:
        return str(exc)
    if not same_host(host, sni) and not (sni is None and ip_literal(host)):
        return f"the TLS server name {sni!r} is not the CONNECT host {host}"
    return None


async def _refuse(writer: asyncio.StreamWriter, verdict: Verdict, status: int = 403) -> None:
    with contextlib.suppress(OSError):
        writer.write(refusal(verdict.reason, verdict.rule, status))
        await writer.drain()


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()
