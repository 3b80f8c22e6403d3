"""Client tokens (stored hashed) and per-client rate limits.

The tokens file is YAML::

    # sandboxd tokens: SHA-256 hashes only; add with `sandboxd token add NAME`
    tokens:
      - client: alice
        sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
        created: "2026-11-21T10:00:00Z"

A token is ``sbx_`` + 43 URL-safe characters (256 random bits), so a plain SHA-256 is enough
(no slow hash needed: nothing to brute-force). The plaintext is printed once by
``sandboxd token add`` and never stored. Lookups compare against every hash with
:func:`hmac.compare_digest`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import stat
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from sandboxd.errors import SandboxdError

log = logging.getLogger("sandboxd.auth")

TOKEN_PREFIX = "sbx_"
_CLIENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEADER = ("# sandboxd tokens: SHA-256 hashes of bearer tokens, each with its client name.\n"
           "# Add one with `sandboxd token add NAME` (the token is printed once, never stored).\n")


class TokenFileError(SandboxdError):
    """The tokens file is unreadable or invalid (the message starts with ``file:line:col:``)."""

    code = "tokens-invalid"


def hash_token(token: str) -> str:
    """SHA-256 (hex) of a token."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    """A fresh random token (``sbx_`` + 256 bits, URL-safe)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class TokenEntry:
    client: str
    sha256: str
    created: str | None = None


def _where(path: Path, node: Node) -> str:
    return f"{path}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"


def _scalar(mapping: MappingNode, key: str) -> tuple[Node, ScalarNode | None]:
    for k, v in mapping.value:
        if isinstance(k, ScalarNode) and k.value == key:
            return k, v if isinstance(v, ScalarNode) else None
    return mapping, None


def _check_file_safety(path: Path) -> None:
    """Whoever can write the tokens file can mint tokens: refuse a file writable by group or
    others, or owned by another unprivileged user."""
    try:
        st = os.stat(path)
    except OSError:
        return  # reported by the read below
    if st.st_mode & 0o022:
        raise TokenFileError(f"{path}:1:1: tokens file is writable by group or others (mode "
                             f"{stat.S_IMODE(st.st_mode):04o}); run: chmod 600 {path}")
    if st.st_uid not in (0, os.geteuid()):
        raise TokenFileError(f"{path}:1:1: tokens file is owned by uid {st.st_uid}, not by "
                             "root or the daemon's user")


def _read(path: Path) -> list[TokenEntry]:
    _check_file_safety(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise TokenFileError(f"{path}:1:1: cannot read tokens file: {reason or exc}") from None
    return _parse(path, text)


def _parse(path: Path, text: str) -> list[TokenEntry]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else f"{path}:1:1"
        raise TokenFileError(f"{where}: YAML syntax error: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise TokenFileError(f"{path}:1:1: YAML error: {exc}") from None
    if root is None:
        return []
    if not isinstance(root, MappingNode):
        raise TokenFileError(f"{_where(path, root)}: expected a mapping with a 'tokens' list")
    tokens_node: Node | None = None
    for k, v in root.value:
        if not (isinstance(k, ScalarNode) and k.value == "tokens"):
            raise TokenFileError(f"{_where(path, k)}: unknown key (expected only 'tokens')")
        tokens_node = v
    if tokens_node is None or (isinstance(tokens_node, ScalarNode) and tokens_node.value in
                               ("", "null", "~")):
        return []
    if not isinstance(tokens_node, SequenceNode):
        raise TokenFileError(f"{_where(path, tokens_node)}: 'tokens' must be a list")
    entries: list[TokenEntry] = []
    seen: dict[str, int] = {}
    for item in tokens_node.value:
        if not isinstance(item, MappingNode):
            raise TokenFileError(f"{_where(path, item)}: each token must be a mapping with "
                                 "client and sha256")
        for k, _v in item.value:
            if not (isinstance(k, ScalarNode) and k.value in ("client", "sha256", "created")):
                raise TokenFileError(f"{_where(path, k)}: unknown key (expected client, sha256, "
                                     "created)")
        where, client = _scalar(item, "client")
        if client is None or not _CLIENT.match(client.value):
            raise TokenFileError(f"{_where(path, client or where)}: client must be a name "
                                 "(letters, digits, '_', '.', '-')")
        where, digest = _scalar(item, "sha256")
        if digest is None or not _HEX64.match(digest.value):
            raise TokenFileError(f"{_where(path, digest or where)}: sha256 must be 64 lowercase "
                                 "hex digits (the hash of the token, never the token itself)")
        if digest.value in seen:
            raise TokenFileError(f"{_where(path, digest)}: duplicate token hash (first on line "
                                 f"{seen[digest.value]})")
        seen[digest.value] = digest.start_mark.line + 1
        _w, created = _scalar(item, "created")
        entries.append(TokenEntry(client.value, digest.value, created.value if created else None))
    return entries


class TokenStore:
    """Token hashes -> client names.

    A store loaded from a file notices when the file changes (checked at most once a second,
    on lookup) and reloads it, so ``sandboxd token add`` / ``remove`` take effect without a
    restart. A broken edit is logged and the previous tokens stay in force.
    """

    CHECK_INTERVAL_S = 1.0

    def __init__(self, entries: list[TokenEntry], path: Path | None = None) -> None:
        self.path = path
        self._set_entries(entries)
        self._stamp = self._file_stamp()
        self._checked = time.monotonic()
        self._reload_lock = threading.Lock()

    def _set_entries(self, entries: list[TokenEntry]) -> None:
        # one attribute holds both views so that readers always see a consistent pair
        self._state = (list(entries), [(bytes.fromhex(e.sha256), e.client) for e in entries])

    @property
    def entries(self) -> list[TokenEntry]:
        return self._state[0]

    def _file_stamp(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    @classmethod
    def load(cls, path: Path) -> TokenStore:
        """Read a tokens file; :class:`TokenFileError` (with file:line:col) when invalid."""
        return cls(_read(Path(path)), Path(path))

    def _maybe_reload(self) -> None:
        if self.path is None or time.monotonic() - self._checked < self.CHECK_INTERVAL_S:
            return
        if not self._reload_lock.acquire(blocking=False):
            return  # another thread is reloading; use the current tokens
        try:
            self._checked = time.monotonic()
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return
            try:
                entries = _read(self.path)
            except TokenFileError as exc:
                log.error("tokens file not reloaded, previous tokens stay in force: %s", exc)
            else:
                self._set_entries(entries)
                log.info("tokens file reloaded: %d token(s)", len(entries))
            self._stamp = stamp
        finally:
            self._reload_lock.release()

    def client_for(self, token: str) -> str | None:
        """The client a bearer token belongs to, or None. Compares against every stored hash
        in constant time (no early exit)."""
        self._maybe_reload()
        if not token:
            return None
        candidate = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found: str | None = None
        for stored, client in self._state[1]:
            if hmac.compare_digest(stored, candidate):
                found = client
        return found

    def clients(self) -> list[str]:
        """Client names that have at least one token."""
        return sorted({e.client for e in self.entries})


def _dump(entries: list[TokenEntry]) -> str:
    data: dict[str, Any] = {"tokens": [
        {"client": e.client, "sha256": e.sha256, **({"created": e.created} if e.created else {})}
        for e in entries
    ]}
    return _HEADER + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _edit(path: Path) -> list[TokenEntry]:
    return TokenStore.load(path).entries if path.exists() else []


def add_token(path: Path, client: str) -> str:
    """Create a token for ``client``, store only its hash in ``path`` (created 0600 if
    needed), and return the plaintext token (the only time it exists)."""
    if not _CLIENT.match(client):
        raise TokenFileError(f"{client!r} is not a valid client name (letters, digits, '_', "
                             "'.', '-'; at most 64)")
    path = Path(path)
    entries = _edit(path)
    token = new_token()
    created = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    entries.append(TokenEntry(client, hash_token(token), created))
    _write_atomic(path, _dump(entries))
    return token


def remove_tokens(path: Path, client: str) -> int:
    """Remove every token of ``client``; return how many were removed."""
    path = Path(path)
    entries = _edit(path)
    kept = [e for e in entries if e.client != client]
    if len(kept) != len(entries):
        _write_atomic(path, _dump(kept))
    return len(entries) - len(kept)


class RateLimiter:
    """Per-client token bucket: ``per_minute`` calls per minute, bursts up to ``per_minute``."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._rate = per_minute / 60.0
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, last update)
        self._lock = threading.Lock()

    def check(self, client: str) -> float | None:
        """Take one call from ``client``'s bucket: None if allowed, else the seconds until a
        call will be allowed (for ``Retry-After``)."""
        if self.per_minute <= 0:
            return None
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(client, (float(self.per_minute), now))
            tokens = min(float(self.per_minute), tokens + (now - last) * self._rate)
            if tokens >= 1.0:
                self._buckets[client] = (tokens - 1.0, now)
                return None
            self._buckets[client] = (tokens, now)
            if len(self._buckets) > 10_000:  # forget full buckets (idle clients)
                full = [c for c, (t, ts) in self._buckets.items()
                        if t + (now - ts) * self._rate >= self.per_minute]
                for c in full:
                    del self._buckets[c]
            return (1.0 - tokens) / self._rate


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
    return (datetime.fromtimestamp(epoch, UTC).isoformat(timespec="microseconds")
            .replace("+00:00", "Z"))


@dataclass
class _Failures:
    """Failed authentications of one peer in the current audit interval."""

    first: float
    last: float
    count: int = 0
    limited: int = 0
    missing: int = 0
    unknown: int = 0
    digests: set[str] | None = None
    paths: set[str] | None = None
    paths_more: int = 0


class FailedAuthGuard:
    """Failed authentications: a per-peer limit, and their audit records aggregated.

    * Each peer may fail ``limit`` times, refilled evenly over ``window_s`` (a token bucket);
      past that :meth:`failure` returns the seconds to wait, and the API answers 429 with
      ``Retry-After`` instead of 401. A *valid* token is never refused by this limit: on a
      shared address (loopback, NAT) one noisy caller must not lock the others out, and a
      256-bit token cannot be guessed, so there is nothing to slow down but the noise.
    * Instead of one audit record per failure (a flood of them grows the log without
      bound), one ``auth_failure`` record per peer per ``interval_s``: how many failures
      (``count``; ``limited`` of them answered 429; ``missing`` without a bearer token,
      ``unknown`` with a token that matches none), the first and last time, every distinct
      token digest (``digests``: the first 12 hex digits of the SHA-256 of each token
      presented, never a token) and the paths asked for. Nothing is dropped: a peer whose
      record would grow past ``max_digests`` digests is written at once and starts a new
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
                entry = self._pending[peer] = _Failures(first=wall, last=wall, digests=set(),
                                                        paths=set())
            entry.last = wall
            entry.count += 1
            entry.limited += wait is not None
            if digest is None:
                entry.missing += 1
            else:
                entry.unknown += 1
                assert entry.digests is not None
                entry.digests.add(digest)
            assert entry.paths is not None
            if path in entry.paths or len(entry.paths) < self.MAX_PATHS:
                entry.paths.add(path)
            else:
                entry.paths_more += 1
            full: list[tuple[str, _Failures]] = []
            if entry.digests is not None and len(entry.digests) >= self.max_digests:
                full.append((peer, self._pending.pop(peer)))
            if len(self._pending) > self.max_peers:
                full.extend(self._pending.items())
                self._pending = {}
        for item in full:
            self._record(*item)
        return wait

    def _take(self, peer: str, now: float) -> float | None:
        if self.limit <= 0:
            return None
        allowance, last = self._buckets.get(peer, (float(self.limit), now))
        allowance = min(float(self.limit), allowance + (now - last) * self._rate)
        if allowance >= 1.0:
            self._buckets[peer] = (allowance - 1.0, now)
            return None
        self._buckets[peer] = (allowance, now)
        if len(self._buckets) > 10_000:  # forget peers whose allowance is full again
            for key, (a, ts) in list(self._buckets.items()):
                if a + (now - ts) * self._rate >= self.limit:
                    del self._buckets[key]
        return (1.0 - allowance) / self._rate

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
            "first": _iso(entry.first), "last": _iso(entry.last),
            "digests": sorted(entry.digests or ()), "paths": sorted(entry.paths or ()),
        }
        if entry.paths_more:
            fields["paths_more"] = entry.paths_more
        try:
            self._write("auth_failure", **fields)
        except Exception as exc:  # the evidence goes to the daemon's log instead
            log.error("cannot audit %d failed authentication(s) of %s: %s; %s",
                      entry.count, peer, exc, json.dumps(fields, sort_keys=True))

