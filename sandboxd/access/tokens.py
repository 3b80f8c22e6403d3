"""Client tokens, stored hashed.

The tokens file is YAML::

    # sandboxd tokens: SHA-256 hashes only; add with `sandboxd token add NAME`
    tokens:
      - client: alice
        sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
        created: "2026-11-21T10:00:00Z"
        label: laptop agent          # optional: what the token is for
        expires: "2027-02-21T10:00:00Z"  # optional: refused from then on
        role: approvers              # optional: may decide any pending approval

A token's id is a prefix of its hash (``sandboxd token list`` shows 12 hex digits);
``sandboxd token remove --id PREFIX`` revokes that one token.

A token is ``sbx_`` + 43 URL-safe characters (256 random bits), so a plain SHA-256 is enough
(no slow hash needed: nothing to brute-force). The plaintext is printed once by
``sandboxd token add`` and never stored. Lookups compare against every hash with
:func:`hmac.compare_digest`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from sandboxd.errors import SandboxdError
from sandboxd.util.timefmt import utc_iso

log = logging.getLogger("sandboxd.access.tokens")

TOKEN_PREFIX = "sbx_"
_CLIENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_KEYS = ("client", "sha256", "created", "label", "expires", "role")
#: what a token may do besides its client's calls: ``approvers`` decide any pending approval
#: (``approve:`` in a policy; not their own client's calls unless the rule lists it)
ROLES = ("approvers",)
MIN_ID_DIGITS = 6
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
    """One token: its client, its hash, and optional creation time, label and expiry."""

    client: str
    sha256: str
    created: str | None = None
    label: str | None = None
    expires: str | None = None
    role: str | None = None

    @property
    def id(self) -> str:
        """The short id admins see and revoke by (the first 12 hex digits of the hash)."""
        return self.sha256[:12]

    def expired(self, now: datetime | None = None) -> bool:
        """Whether the token's expiry has passed."""
        if self.expires is None:
            return False
        return (now or datetime.now(UTC)) >= parse_time(self.expires)


def parse_time(text: str) -> datetime:
    """An ISO 8601 time (``Z`` or an offset; a bare date is midnight UTC) as an aware UTC
    datetime; ValueError when it is none."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def iso(value: datetime) -> str:
    """A UTC time as ``YYYY-MM-DDTHH:MM:SSZ``."""
    return utc_iso(value, timespec="seconds")


def _where(path: Path, node: Node) -> str:
    return f"{path}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"


def _named(node: Node, names: tuple[str, ...]) -> bool:
    """Whether a mapping key is a scalar among ``names``."""
    return isinstance(node, ScalarNode) and node.value in names


def _scalar(mapping: MappingNode, key: str) -> tuple[Node, ScalarNode | None]:
    for k, v in mapping.value:
        if _named(k, (key,)):
            return k, v if isinstance(v, ScalarNode) else None
    return mapping, None


def _only_keys(path: Path, mapping: MappingNode, names: tuple[str, ...], expected: str) -> None:
    """Refuse the first key of ``mapping`` not among ``names``, at its place."""
    unknown = next((k for k, _v in mapping.value if not _named(k, names)), None)
    if unknown is not None:
        raise TokenFileError(f"{_where(path, unknown)}: unknown key (expected {expected})")


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


def _compose(path: Path, text: str) -> Node | None:
    """The YAML node tree of a tokens file (None: an empty file); a syntax error at its
    place."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else f"{path}:1:1"
        raise TokenFileError(f"{at}: YAML syntax error: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise TokenFileError(f"{path}:1:1: YAML error: {exc}") from None


def _is_null(node: Node) -> bool:
    """Whether a value is an empty scalar (``tokens:`` with nothing after it)."""
    return isinstance(node, ScalarNode) and node.value in ("", "null", "~")


def _tokens_node(path: Path, text: str) -> SequenceNode | None:
    """The ``tokens`` list of a tokens file (None: an empty file or list)."""
    root = _compose(path, text)
    if root is None:
        return None
    if not isinstance(root, MappingNode):
        raise TokenFileError(f"{_where(path, root)}: expected a mapping with a 'tokens' list")
    _only_keys(path, root, ("tokens",), "only 'tokens'")
    if not root.value:
        return None
    tokens_node: Node = root.value[-1][1]
    if _is_null(tokens_node):
        return None
    if not isinstance(tokens_node, SequenceNode):
        raise TokenFileError(f"{_where(path, tokens_node)}: 'tokens' must be a list")
    return tokens_node


def _checked(path: Path, item: MappingNode, key: str, ok: Callable[[str], bool],
             why: str) -> str | None:
    """The value of the scalar ``key`` of ``item`` (None when absent), or the problem at its
    place (``why``, with ``{value!r}`` standing for the value)."""
    node = _scalar(item, key)[1]
    if node is None:
        return None
    if not ok(node.value):
        raise TokenFileError(f"{_where(path, node)}: {why.format(value=node.value)}")
    return str(node.value)


def _required(path: Path, item: MappingNode, key: str, pattern: re.Pattern[str],
              why: str) -> ScalarNode:
    where, node = _scalar(item, key)
    if node is None or not pattern.match(node.value):
        raise TokenFileError(f"{_where(path, node or where)}: {why}")
    return node


def _is_time(value: str) -> bool:
    try:
        parse_time(value)
    except ValueError:
        return False
    return True


def _value(item: MappingNode, key: str) -> str | None:
    """The scalar ``key`` of ``item`` as it is (None when absent)."""
    node = _scalar(item, key)[1]
    return None if node is None else str(node.value)


def _entry(path: Path, item: Node, seen: dict[str, int]) -> TokenEntry:
    """One entry of the ``tokens`` list, checked (``seen``: the hashes above it, by line)."""
    if not isinstance(item, MappingNode):
        raise TokenFileError(f"{_where(path, item)}: each token must be a mapping with "
                             "client and sha256")
    _only_keys(path, item, _KEYS, ", ".join(_KEYS))
    client = _required(path, item, "client", _CLIENT,
                       "client must be a name (letters, digits, '_', '.', '-')")
    digest = _required(path, item, "sha256", _HEX64, "sha256 must be 64 lowercase hex digits "
                       "(the hash of the token, never the token itself)")
    if digest.value in seen:
        raise TokenFileError(f"{_where(path, digest)}: duplicate token hash (first on line "
                             f"{seen[digest.value]})")
    seen[digest.value] = digest.start_mark.line + 1
    return TokenEntry(
        client.value, digest.value,
        created=_value(item, "created"), label=_value(item, "label"),
        expires=_checked(path, item, "expires", _is_time,
                         "expires must be an ISO 8601 time, e.g. 2027-01-31T00:00:00Z"),
        role=_checked(path, item, "role", ROLES.__contains__,
                      f"unknown role {{value!r}} (roles: {', '.join(ROLES)})"))


def _parse(path: Path, text: str) -> list[TokenEntry]:
    tokens_node = _tokens_node(path, text)
    if tokens_node is None:
        return []
    seen: dict[str, int] = {}
    return [_entry(path, item, seen) for item in tokens_node.value]


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
        self._state = (list(entries), [(bytes.fromhex(e.sha256), e) for e in entries])

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
        self.refresh()

    def refresh(self) -> None:
        """Reload the file now if it changed (the revocation watcher calls it every
        :attr:`CHECK_INTERVAL_S`); a broken file is logged and the last good tokens stay."""
        if self.path is None:
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

    def entry_for(self, token: str) -> TokenEntry | None:
        """The entry a bearer token matches (expired or not), or None. Compares against every
        stored hash in constant time (no early exit)."""
        self._maybe_reload()
        if not token:
            return None
        candidate = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found: TokenEntry | None = None
        for stored, entry in self._state[1]:
            if hmac.compare_digest(stored, candidate):
                found = entry
        return found

    def client_for(self, token: str) -> str | None:
        """The client a valid (known, unexpired) bearer token belongs to, or None."""
        entry = self.entry_for(token)
        return None if entry is None or entry.expired() else entry.client

    def clients(self) -> list[str]:
        """Client names that have at least one token."""
        return sorted({e.client for e in self.entries})

    def valid_clients(self, now: datetime | None = None) -> set[str]:
        """Client names that have at least one unexpired token (the last good file's)."""
        now = now or datetime.now(UTC)
        return {e.client for e in self.entries if not e.expired(now)}


def _dump(entries: list[TokenEntry]) -> str:
    data: dict[str, Any] = {"tokens": [
        {"client": e.client, "sha256": e.sha256,
         **{key: getattr(e, key) for key in ("created", "label", "expires", "role")
           if getattr(e, key)}}
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


def _check_request(client: str, label: str | None, role: str | None,
                   expires: datetime | None, now: datetime) -> None:
    """Refuse a new token's bad client name, label, role or expiry (TokenFileError)."""
    if not _CLIENT.match(client):
        raise TokenFileError(f"{client!r} is not a valid client name (letters, digits, '_', "
                             "'.', '-'; at most 64)")
    if label is not None and (not label.strip() or len(label) > 200 or not label.isprintable()):
        raise TokenFileError("a label must be 1 to 200 printable characters")
    if role is not None and role not in ROLES:
        raise TokenFileError(f"unknown role {role!r} (roles: {', '.join(ROLES)})")
    if expires is not None and expires <= now:
        raise TokenFileError(f"the expiry {iso(expires)} is not in the future")


def add_token(path: Path, client: str, *, label: str | None = None,
              expires: datetime | None = None, role: str | None = None) -> str:
    """Create a token for ``client`` (optionally labelled, optionally expiring), store only
    its hash in ``path`` (created 0600 if needed), and return the plaintext token (the only
    time it exists)."""
    now = datetime.now(UTC)
    _check_request(client, label, role, expires, now)
    path = Path(path)
    entries = _edit(path)
    token = new_token()
    entries.append(TokenEntry(client, hash_token(token), iso(now), label,
                              iso(expires) if expires is not None else None, role))
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


def _id_digits(prefix: str) -> str:
    """The hex digits of a token id as an admin types it (``sha256:`` may lead, ``…`` may
    trail); TokenFileError when too few."""
    wanted = prefix.lower().removeprefix("sha256:").rstrip("…")
    if len(wanted) < MIN_ID_DIGITS or not re.fullmatch(r"[0-9a-f]+", wanted):
        raise TokenFileError(f"token id {prefix!r}: give at least {MIN_ID_DIGITS} hex digits "
                             "of the hash, as `sandboxd token list` shows")
    return wanted


def remove_token_by_id(path: Path, prefix: str) -> TokenEntry:
    """Revoke the one token whose hash starts with ``prefix`` (at least
    :data:`MIN_ID_DIGITS` hex digits; ``sha256:`` may lead); TokenFileError when none or
    several match."""
    wanted = _id_digits(prefix)
    path = Path(path)
    entries = _edit(path)
    matches = [e for e in entries if e.sha256.startswith(wanted)]
    if not matches:
        raise TokenFileError(f"no token with id {wanted} in {path}")
    if len(matches) > 1:
        raise TokenFileError(f"token id {wanted} matches {len(matches)} tokens; give more "
                             "digits")
    entries.remove(matches[0])  # hashes are unique: this is the one entry
    _write_atomic(path, _dump(entries))
    return matches[0]
