"""Name resolution for the egress proxy: the proxy resolves every name itself (a sandbox has
no resolver), and connects only to an address it resolved for an allowed name.

By default the host's resolver answers (``getaddrinfo``); the ``egress_resolver`` setting
(``IP:PORT``) names a DNS server the proxy asks directly instead (A and AAAA over UDP), e.g.
a split-horizon resolver, or the tests' own fake internet.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
from typing import cast

from dnslib import QTYPE, DNSRecord  # type: ignore[import-untyped]

from sandboxd.egress.rules import IPAddress
from sandboxd.util.deadline import bounded

RESOLVE_TIMEOUT_S = 5.0
MAX_ANSWERS = 16


class ResolveError(Exception):
    """The name has no usable address (or the resolver did not answer)."""


class _Query(asyncio.DatagramProtocol):
    def __init__(self, packet: bytes) -> None:
        self.packet = packet
        self.answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.DatagramTransport, transport).sendto(self.packet)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if not self.answer.done():
            self.answer.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self.answer.done():
            self.answer.set_exception(exc)


class Resolver:
    """``server``: ``(ip, port)`` of the DNS server to ask; None: the host's resolver."""

    def __init__(self, server: tuple[str, int] | None = None) -> None:
        self.server = server

    async def resolve(self, host: str) -> list[IPAddress]:
        try:
            found = await bounded(self._ask(host) if self.server is not None
                                  else self._host(host), RESOLVE_TIMEOUT_S)
        except (TimeoutError, OSError) as exc:
            raise ResolveError(f"{host} did not resolve: {exc or 'timeout'}") from None
        if not found:
            raise ResolveError(f"{host} has no address")
        return found[:MAX_ANSWERS]

    @staticmethod
    async def _host(host: str) -> list[IPAddress]:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None,
                                                             type=socket.SOCK_STREAM)
        out: list[IPAddress] = []
        for info in infos:
            addr = ipaddress.ip_address(str(info[4][0]).split("%")[0])
            if addr not in out:
                out.append(addr)
        return out

    async def _ask(self, host: str) -> list[IPAddress]:
        out: list[IPAddress] = []
        for qtype in ("A", "AAAA"):
            out += await self._query(host, qtype)
        return out

    async def _query(self, host: str, qtype: str) -> list[IPAddress]:
        """The addresses of one question (``A`` or ``AAAA``) to the configured server
        (``OSError`` for an answer to another query)."""
        assert self.server is not None
        query = DNSRecord.question(host, qtype)
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in self.server[0] else socket.AF_INET
        transport, proto = await loop.create_datagram_endpoint(
            functools.partial(_Query, query.pack()), remote_addr=self.server, family=family)
        try:
            reply = DNSRecord.parse(await proto.answer)
        finally:
            transport.close()
        if reply.header.id != query.header.id:
            raise OSError("the resolver's answer does not match the query")
        return [ipaddress.ip_address(str(rr.rdata)) for rr in reply.rr
                if rr.rtype in (QTYPE.A, QTYPE.AAAA)]
