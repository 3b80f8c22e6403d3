"""A terminated tunnel (a host with ``secrets``): one request, read in the clear, checked
against the method/path rules, sent on with the secret header over verified TLS; the
response comes back with the secret's value masked wherever it appears."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from sandboxd.egress.decide import Verdict, check_target, same_host
from sandboxd.egress.rules import EgressRules, SecretSpec
from sandboxd.egress.tls import SecretUnavailable, ServerSide, masked, secret_value
from sandboxd.egress.wire import (
    CONNECT_TIMEOUT_S,
    HEAD_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    MAX_HEAD_BYTES,
    BadRequest,
    Head,
    body_length,
    parse_head,
    refusal,
    upstream_head,
)
from sandboxd.util.deadline import bounded

if TYPE_CHECKING:
    from sandboxd.egress.proxy import Conn, EgressProxy


async def _head(side: ServerSide) -> tuple[bytes, bytes] | None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = await side.read()
        if not chunk:
            return None
        buf += chunk
        if len(buf) > MAX_HEAD_BYTES:
            raise BadRequest("request head too large")
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


async def _greet(side: ServerSide) -> tuple[bytes, bytes] | None:
    """The TLS handshake with the sandbox, then the request's head and the bytes read past
    it (``None``: the sandbox closed first)."""
    await side.handshake()
    return await _head(side)


def _verdict(rules: EgressRules, host: str, port: int, head: Head) -> Verdict:
    """The rules' verdict on the request's method and path, refused when its ``Host`` header
    does not name the CONNECT host."""
    verdict = check_target(rules, host, port, head.method, head.path)
    if verdict.allowed and not same_host(host, head.header("host")):
        verdict = Verdict(False, verdict.rule, f"the Host header {head.header('host')!r} "
                          f"does not name the CONNECT host {host}")
    return verdict


async def terminate(proxy: EgressProxy, conn: Conn, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, hello: bytes, spec: SecretSpec) -> None:
    """Serve one request of a tunnel to ``conn.host`` that the proxy terminates."""
    assert conn.host is not None and conn.port is not None and proxy.ca is not None
    rules = conn.ident.rules
    try:
        value = secret_value(spec)
    except SecretUnavailable as exc:
        conn.verdict = Verdict(False, f"egress.secrets.{conn.host}", str(exc))
        return
    side = ServerSide(proxy.ca.context_for(conn.host), reader, writer, hello)
    try:
        got = await bounded(_greet(side), HEAD_TIMEOUT_S)
        if got is None:
            return
        head = parse_head(got[0], origin=(conn.host, conn.port))
        length = body_length(head)
    except BadRequest as exc:
        conn.verdict = Verdict(False, "egress (request head)", str(exc))
        await side.write(refusal(str(exc), conn.verdict.rule, 400))
        return
    conn.method, conn.path = head.method, head.path
    verdict = conn.verdict = _verdict(rules, conn.host, conn.port, head)
    if not verdict.allowed:
        await side.write(refusal(verdict.reason, verdict.rule))
        await side.close()
        return
    # identity encoding: a compressed answer could carry the value past the mask
    out = upstream_head(head, drop=frozenset({spec.header.lower(), "accept-encoding"}),
                        add=(f"{spec.header}: {value}", "Accept-Encoding: identity"))
    out += got[1][:length]
    assert conn.address is not None
    up_r, up_w = await bounded(asyncio.open_connection(
        conn.address, conn.port, ssl=proxy.upstream_tls, server_hostname=conn.host),
        CONNECT_TIMEOUT_S)
    conn.upstream = up_w
    up_w.write(out)
    conn.sent += len(out)
    await _relay(conn, side, up_r, up_w, value.encode("latin-1"),
                 length - len(got[1][:length]))


async def _relay(conn: Conn, side: ServerSide, up_r: asyncio.StreamReader,
                 up_w: asyncio.StreamWriter, secret: bytes, left: int) -> None:
    """The rest of the request's body (``left`` bytes, no more: a pipelined request would
    pass unchecked), and the answer, masked."""
    async def outbound() -> None:
        remaining = left
        while remaining > 0 and (data := await side.read()):
            data = data[:remaining]
            remaining -= len(data)
            up_w.write(data)
            await up_w.drain()
            conn.sent += len(data)

    async def inbound() -> None:
        tail = b""
        while True:
            data = await bounded(up_r.read(64 * 1024), IDLE_TIMEOUT_S)
            if not data:
                break
            now, tail = masked(secret, tail, data)
            if now:
                await side.write(now)
                conn.received += len(now)
        if tail:
            await side.write(tail)
            conn.received += len(tail)
        await side.close()

    tasks = [asyncio.ensure_future(outbound()), asyncio.ensure_future(inbound())]
    try:
        await tasks[1]
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
