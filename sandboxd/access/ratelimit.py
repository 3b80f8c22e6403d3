"""Rate limits and failed-authentication accounting (tokens themselves:
:mod:`sandboxd.access.tokens`).

* :class:`RateLimiter`: per-client call limits over a sliding minute.
* :func:`peer_key`: the address failures and connections are counted against.
* :class:`FailedAuthGuard`: per-peer limits on failed authentications, audited in aggregate.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandboxd.util.timefmt import utc_iso

log = logging.getLogger("sandboxd.access.ratelimit")


class RateLimiter:
    """Per-client limit: at most ``per_minute`` calls in any 60 seconds (a sliding window, so
    the limit means exactly what it says: no burst on top, no refill within the minute)."""

    WINDOW_S = 60.0
    MAX_CLIENTS = 10_000

    def __init__(self, per_minute: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._calls: dict[str, deque[float]] = {}  # client -> admission times, oldest first
        self._lock = threading.Lock()

    def check(self, client: str) -> float | None:
        """Count one call of ``client``: None if allowed, else the seconds until a call will
        be allowed (for ``Retry-After``)."""
        if self.per_minute <= 0:
            return None
        now = self._clock()
        with self._lock:
            calls = self._calls_of(client, now)
            while calls and now - calls[0] >= self.WINDOW_S:
                calls.popleft()
            if len(calls) < self.per_minute:
                calls.append(now)
                return None
            return max(calls[0] + self.WINDOW_S - now, 0.001)

    def _calls_of(self, client: str, now: float) -> deque[float]:
        """The admission times of ``client`` (lock held); a new client's table entry made
        after the idle clients are forgotten, when the table is full."""
        calls = self._calls.get(client)
        if calls is None:
            if len(self._calls) >= self.MAX_CLIENTS:
                self._forget_idle(now)
            calls = self._calls[client] = deque()
        return calls

    def _forget_idle(self, now: float) -> None:
        idle = [c for c, calls in self._calls.items()
                if not calls or now - calls[-1] >= self.WINDOW_S]
        for client in idle:
            del self._calls[client]


def peer_key(host: str | None) -> str:
    """The address failed authentications and connections are counted against: the IPv4
    address, the /64 of an IPv6 address (one host usually owns a whole /64), ``unix`` for a
    unix-socket peer."""
    if not host:
        return "unix"
    import ipaddress

    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        if not address.is_loopback:
            return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def _iso(epoch: float) -> str:
    return utc_iso(epoch)


@dataclass
class _Failures:
    """Failed authentications of one peer in the current audit interval."""

    first: float
    last: float
    count: int = 0
    limited: int = 0
    missing: int = 0
    unknown: int = 0
    expired: int = 0
    digests: set[str] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)
    paths_more: int = 0


class FailedAuthGuard:
    """Failed authentications: a per-peer limit, and their audit records aggregated.

    * Each peer may fail ``limit`` times, refilled evenly over ``window_s`` (a token bucket);
      past that :meth:`failure` returns the seconds to wait, and the API answers 429 with
      ``Retry-After`` instead of 401. A *valid* token is never refused by this limit: on a
      shared address (loopback, NAT) one noisy caller must not lock the others out, and a
      256-bit token cannot be guessed, so there is nothing to slow down but the noise.
    * Instead of one audit record per failure (a flood of them grows the log without bound),
      one ``auth_failure`` record per peer per ``interval_s``: how many failures (``count``;
      ``limited`` of them answered 429; ``missing`` without a bearer token, ``unknown`` with a
      token that matches none, ``expired`` with an expired one), the first and last time,
      every distinct token digest (``digests``: the first 12 hex digits of the SHA-256 of each
      token presented, never a token) and the paths asked for. Nothing is dropped: a peer
      whose record would grow past ``max_digests`` digests is written at once and starts a new
      one, and so are all peers when more than ``max_peers`` are pending.
      :meth:`flush` writes the pending records (every interval, and at shutdown).
    """

    MAX_PATHS = 16

    def __init__(self, write: Any, *, limit: int = 20, window_s: float = 60.0,
                 interval_s: float = 60.0, max_digests: int = 256,
                 max_peers: int = 4096) -> None:
        self._write = write  # write(event, **fields) -> the audit record
        self.limit = limit
        self.window_s = window_s
        self.interval_s = interval_s
        self.max_digests = max_digests
        self.max_peers = max_peers
        self._rate = limit / window_s if limit > 0 else 0.0
        self._buckets: dict[str, tuple[float, float]] = {}  # peer -> (allowance, last update)
        self._pending: dict[str, _Failures] = {}
        self._lock = threading.Lock()

    def failure(self, peer: str, *, reason: str, path: str, digest: str | None) -> float | None:
        """Count one failed authentication of ``peer``: None if it may be answered 401, else
        the seconds until this peer's next failure would be (for 429 ``Retry-After``)."""
        now = time.monotonic()
        wall = time.time()
        with self._lock:
            wait = self._take(peer, now)
            entry = self._pending.get(peer)
            if entry is None:
                entry = self._pending[peer] = _Failures(first=wall, last=wall)
            self._count(entry, wall, wait is not None, reason, path, digest)
            full: list[tuple[str, _Failures]] = []
            if len(entry.digests) >= self.max_digests:
                full.append((peer, self._pending.pop(peer)))
            if len(self._pending) > self.max_peers:
                full.extend(self._pending.items())
                self._pending = {}
        for item in full:
            self._record(*item)
        return wait

    def _count(self, entry: _Failures, wall: float, limited: bool, reason: str, path: str,
               digest: str | None) -> None:
        """Count one failure at ``wall`` in ``entry``: its kind, its token digest, and its
        path (up to :attr:`MAX_PATHS` distinct ones; past that only counted)."""
        entry.last = wall
        entry.count += 1
        entry.limited += limited
        if digest is None:
            entry.missing += 1
        else:
            entry.digests.add(digest)
            if reason.startswith("expired"):
                entry.expired += 1
            else:
                entry.unknown += 1
        if path in entry.paths or len(entry.paths) < self.MAX_PATHS:
            entry.paths.add(path)
        else:
            entry.paths_more += 1

    def _take(self, peer: str, now: float) -> float | None:
        if self.limit <= 0:
            return None
        allowance, last = self._buckets.get(peer, (float(self.limit), now))
        allowance = min(float(self.limit), allowance + (now - last) * self._rate)
        if allowance >= 1.0:
            self._buckets[peer] = (allowance - 1.0, now)
            return None
        self._buckets[peer] = (allowance, now)
        if len(self._buckets) > 10_000:
            self._forget_full(now)
        return (1.0 - allowance) / self._rate

    def _forget_full(self, now: float) -> None:
        """Forget the peers whose allowance is full again (as if never seen)."""
        for key, (a, ts) in list(self._buckets.items()):
            if a + (now - ts) * self._rate >= self.limit:
                del self._buckets[key]

    def pending(self) -> int:
        """Failures counted but not yet written."""
        with self._lock:
            return sum(f.count for f in self._pending.values())

    def flush(self) -> int:
        """Write one record per peer with pending failures; return how many were written."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for peer, entry in pending.items():
            self._record(peer, entry)
        return len(pending)

    def _record(self, peer: str, entry: _Failures) -> None:
        fields: dict[str, Any] = {
            "peer": peer, "count": entry.count, "limited": entry.limited,
            "missing": entry.missing, "unknown": entry.unknown,
            "expired": entry.expired,
            "first": _iso(entry.first), "last": _iso(entry.last),
            "digests": sorted(entry.digests), "paths": sorted(entry.paths),
        }
        if entry.paths_more:
            fields["paths_more"] = entry.paths_more
        try:
            self._write("auth_failure", **fields)
        except Exception as exc:  # the evidence goes to the daemon's log instead
            log.error("cannot audit %d failed authentication(s) of %s: %s; %s",
                      entry.count, peer, exc, json.dumps(fields, sort_keys=True))

