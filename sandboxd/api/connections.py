"""Connection limits below the HTTP layer: a header timeout, and caps on open connections.

Before a request reaches the app (and its token check) it costs the daemon a connection and a
file descriptor. Without limits, clients that connect and never finish their request headers
(or send them a byte at a time) pile up until the daemon runs out of descriptors and refuses
everyone. uvicorn has a keep-alive timeout but no header timeout, so the server uses
:func:`guarded_protocol`, uvicorn's own HTTP protocol class with three additions:

* **Header timeout**: a connection must complete its request headers within
  ``header_timeout_s`` of connecting (and of its previous response, on a kept-alive
  connection), however slowly it trickles them; otherwise it is closed.
* **Body and answer deadlines**: a request body that sends nothing for
  ``request_body_timeout_s`` (the daemon waiting to read, not the other way round), and an
  answer the client reads none of for ``response_write_timeout_s`` (the send buffer full), close
  the connection. A client that does not send, or does not read, then holds neither the call's
  task nor a stop (uvicorn waits for every request's task before the daemon exits).
* **Caps**: at most ``max_connections`` open connections in all (default: half of
  ``RLIMIT_NOFILE``, so that the daemon's own files, workers and the accept of the next
  connection always find a descriptor) and ``max_connections_per_peer`` from one address
  (default: a quarter of the total; an IPv6 peer is its /64).
* **Eviction rather than refusal**: a new connection over a cap closes the *idle* connection
  of that peer (or, for the total cap, of anyone) that has waited longest - idle meaning no
  request in progress: still sending headers, or kept alive after a response. So a flood of
  half-open connections only ever displaces itself, and ``/healthz`` or an authenticated
  client that connects and sends its request gets served. Only when every connection under
  the cap is busy with a request is the new one answered 503 and closed.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import OrderedDict
from typing import Any

from sandboxd.access.ratelimit import peer_key

log = logging.getLogger("sandboxd.connections")

_SCAN = 64  # busy connections passed over per eviction, at most (they move to the back)
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"connection: close\r\nretry-after: 1\r\ncontent-length: 34\r\n\r\n"
            b"too many connections; retry later\n")


def descriptor_limit() -> int:
    """The daemon's soft ``RLIMIT_NOFILE``."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def connection_caps(max_connections: int | None, per_peer: int | None,
                    nofile: int | None = None) -> tuple[int, int]:
    """(total, per peer): the settings, or derived from the descriptor limit; never more
    than the descriptor limit leaves room for (a quarter of it, at least 64, stays free)."""
    nofile = nofile if nofile is not None else descriptor_limit()
    ceiling = max(8, nofile - max(64, nofile // 4))
    total = min(max_connections or max(8, nofile // 2), ceiling)
    if max_connections and total < max_connections:
        log.warning("max_connections %d lowered to %d: RLIMIT_NOFILE is %d",
                    max_connections, total, nofile)
    peer = min(per_peer or max(4, total // 4), total)
    return total, peer


class ConnectionGuard:
    """Open connections in the order they last became idle, in all and per peer."""

    def __init__(self, max_connections: int, per_peer: int, header_timeout_s: float,
                 on_close: Any = None, *, body_timeout_s: float = 30.0,
                 write_timeout_s: float = 30.0) -> None:
        self.max_connections = max_connections
        self.per_peer = per_peer
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.write_timeout_s = write_timeout_s
        self._on_close = on_close or (lambda reason: None)
        self._all: OrderedDict[Any, None] = OrderedDict()
        self._peers: dict[str, OrderedDict[Any, None]] = {}
        self._counts = {"evicted": 0, "refused": 0, "header_timeout": 0, "body_timeout": 0,
                        "write_timeout": 0}
        self._reported = time.monotonic()

    def __len__(self) -> int:
        return len(self._all)

    def admit(self, conn: Any) -> bool:
        """Register a new connection, evicting idle ones over the caps; False: refuse it."""
        mine = self._peers.get(conn.peer)
        if mine is not None and len(mine) >= self.per_peer and not self._evict(mine):
            self.closed("refused")
            return False
        if len(self._all) >= self.max_connections and not self._evict(self._all):
            self.closed("refused")
            return False
        self._all[conn] = None
        self._peers.setdefault(conn.peer, OrderedDict())[conn] = None
        return True

    def idle(self, conn: Any) -> None:
        """``conn`` finished a response and waits for the next request: to the back."""
        if conn in self._all:
            self._all.move_to_end(conn)
            self._peers[conn.peer].move_to_end(conn)

    def remove(self, conn: Any) -> None:
        """``conn`` is gone (idempotent)."""
        if conn in self._all:
            del self._all[conn]
            mine = self._peers[conn.peer]
            del mine[conn]
            if not mine:
                del self._peers[conn.peer]

    def _evict(self, order: OrderedDict[Any, None]) -> bool:
        for _ in range(min(len(order), _SCAN)):
            conn = next(iter(order))
            if conn.busy():
                order.move_to_end(conn)
                continue
            self.remove(conn)
            conn.transport.close()
            self.closed("evicted")
            return True
        return False

    def closed(self, reason: str) -> None:
        """Count a connection the guard closed; log the counts at most every 10 s."""
        self._counts[reason] += 1
        self._on_close(reason)
        now = time.monotonic()
        if now - self._reported >= 10.0:
            self._reported = now
            counts = ", ".join(f"{k} {v}" for k, v in self._counts.items() if v)
            log.warning("connection limits at work (open %d of %d, %d per peer): %s",
                        len(self._all), self.max_connections, self.per_peer, counts)
            self._counts = dict.fromkeys(self._counts, 0)


def guarded_protocol(guard: ConnectionGuard) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class (httptools, else h11) with ``guard``'s limits."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    # uvicorn declares AutoHTTPProtocol as asyncio.Protocol, but picks H11Protocol or
    # HttpToolsProtocol at import: both have the members used below, the declared type none
    base: Any = AutoHTTPProtocol

    class GuardedHTTPProtocol(base):  # type: ignore[misc]  # (Any base: see above)
        peer = "unix"
        _header_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None
        _write_timer: asyncio.TimerHandle | None = None
        _admitted = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self.peer = peer_key(self.client[0] if self.client else None)
            if not guard.admit(self):
                transport.write(_REFUSAL)
                transport.close()
                return
            self._admitted = True
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            for timer in (self._header_timer, self._body_timer, self._write_timer):
                if timer is not None:
                    timer.cancel()
            self._header_timer = self._body_timer = self._write_timer = None
            if self._admitted:
                guard.remove(self)
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._admitted and not self.transport.is_closing():
                guard.idle(self)
                self._arm()  # the next request's headers get the same time

        def busy(self) -> bool:
            """A request is in progress (its headers are complete, its response is not)."""
            cycle = self.cycle
            return cycle is not None and not cycle.response_complete

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._arm_body()

        def on_body(self, body: bytes) -> None:
            super().on_body(body)
            self._arm_body()  # a pause, not the whole body, is what is bounded

        def on_message_complete(self) -> None:
            super().on_message_complete()
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        def _arm_body(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
            self._body_timer = self.loop.call_later(guard.body_timeout_s, self._body_timeout)

        def _body_timeout(self) -> None:
            self._body_timer = None
            cycle = self.cycle
            if cycle is None or not cycle.more_body or self.transport.is_closing():
                return
            if self.flow is not None and self.flow.read_paused:
                self._arm_body()  # the app is not reading yet: the wait is ours, not theirs
                return
            guard.closed("body_timeout")
            self.transport.abort()  # the app's receive() says http.disconnect

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._write_timer is None and self._admitted:
                self._write_timer = self.loop.call_later(guard.write_timeout_s,
                                                         self._write_timeout)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None

        def _write_timeout(self) -> None:
            # the client read nothing of the answer for write_timeout_s: abort (a close would
            # wait for the buffer to drain); the blocked send() returns, its task ends
            self._write_timer = None
            guard.closed("write_timeout")
            self.transport.abort()

        def _arm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(guard.header_timeout_s,
                                                      self._header_timeout)

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self.busy() or self.transport.is_closing():
                return  # headers completed in time; re-armed after the response
            guard.closed("header_timeout")
            self.transport.close()

    return GuardedHTTPProtocol
