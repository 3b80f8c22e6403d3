"""The audit log: append-only JSON Lines, hash-chained, fsynced, rotated by size.

Every record is one line: ``{"ts": ..., "seq": N, "event": ..., <fields>, "prev": <sha256>}``
where ``prev`` is the SHA-256 (hex) of the previous record's line (its exact bytes, without
the newline); the first record of a log has ``seq`` 0 and ``prev`` = 64 zeros. ``seq`` and
``prev`` continue across rotated files (``audit.jsonl.1`` is the newest rotated file,
``audit.jsonl.2`` the one before, ...), so :func:`verify` detects an edited, removed, inserted
or reordered record anywhere in the chain.

Retention: rotated files are kept for ever unless ``retention_files`` (keep the N newest) or
``retention_days`` (delete those last written longer ago) say otherwise; the oldest files go
first, so what is left is always one unbroken stretch of the chain. Before deleting, the log
appends an ``audit_pruned`` record naming the files, the seq range they held, and the anchor
of what stays: ``anchor_seq`` and ``anchor_prev``, the seq and ``prev`` of the first record
kept. :func:`verify` accepts a chain that does not start at seq 0 only when such a record,
inside the verified chain, names exactly its first record; removing any other file still
fails.

Writes use ``O_APPEND`` and ``fdatasync`` before :meth:`AuditLog.write` returns; any failure
raises :class:`AuditError` and the record is not considered written (the file is truncated
back to the last good record). One process at a time may write a log (an exclusive ``flock``
on ``<path>.lock``).

Crash mid-write: a record is one ``write(2)``, so a crash leaves at most a torn final line
without its newline. :func:`verify` reports such a tail as a warning (the record was never
acknowledged: the call it belongs to did not get a response). Opening the log again repairs
it: the torn bytes are cut off and an ``audit_repaired`` record (their length and SHA-256)
continues the chain.

Limits of a hash chain without a secret: it proves order and integrity *relative to the last
record*; removing records from the end, or rewriting the whole chain, needs an external
anchor. :func:`verify` prints the head (last seq and hash) so it can be recorded elsewhere.

Arguments are stored as a SHA-256 digest of their canonical JSON plus a size-capped preview
from which secrets (tokens, keys, passwords; by key name and by pattern) are redacted; every
other field of every record goes through the same redaction (best effort, by pattern). A
digest of a high-entropy credential (``token_digest``, ``api_key_sha256``) is kept: it is how
an admin matches a 401 to a token without the token being logged. Digests of passwords and
other secrets a person may have chosen stay redacted (they can be guessed from the digest).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sandboxd import storage
from sandboxd.errors import SandboxdError
from sandboxd.models import Decision, Result

GENESIS = "0" * 64
PREVIEW_CHARS = 1024
MESSAGE_CHARS = 2048
RESERVED = frozenset({"ts", "seq", "event", "prev"})
REDACTED = "[REDACTED]"

log = logging.getLogger("sandboxd.audit")


class AuditError(SandboxdError):
    """The audit log cannot be written (the call that needed the record must fail)."""

    code = "audit-unwritable"


# ------------------------------------------------------------------ serialisation


def _json_default(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, set | frozenset | tuple):
        return list(obj)
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "replace")
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the bytes the argument digest is computed over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=_json_default).encode("utf-8", "surrogatepass")


def digest(obj: Any) -> str:
    """SHA-256 (hex) of ``obj``'s canonical JSON."""
    return hashlib.sha256(canonical_json(obj)).hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


# ------------------------------------------------------------------ redaction

_SECRET_KEY = re.compile(
    r"^(?:.*[_.-])?(?:pass(?:word|wd|phrase)?|secrets?|tokens?|api[_-]?keys?|apikey|"
    r"authori[sz]ation|auth|credentials?|private[_-]?key|access[_-]?key|session[_-]?(?:id|key)|"
    r"cookies?|signature)(?:[_.-].*)?$", re.IGNORECASE)
# ... except a digest of a machine-made credential: not a secret, and the only way to tell
# which token a failed authentication used
_CREDENTIAL_DIGEST_KEY = re.compile(
    r"^(?:.*[_.-])?(?:tokens?|api[_-]?keys?|apikey|access[_-]?keys?|session[_-]?(?:id|key))"
    r"[_.-](?:digest|sha256|fingerprint)$", re.IGNORECASE)
_SECRET_TEXT: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----"
                r"|\Z)", re.DOTALL), "[REDACTED PRIVATE KEY]"),
    (re.compile(r"(?i)\b(bearer|basic|token)(\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1\2" + REDACTED),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), REDACTED),
    (re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"), REDACTED),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), REDACTED),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), REDACTED),
    (re.compile(r"\bsbx_[A-Za-z0-9_-]{16,}"), REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),
    (re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]+:)[^@\s/]+@", re.IGNORECASE),
     r"\1" + REDACTED + "@"),
    (re.compile(r"(?i)(\b[\w.-]*(?:pass(?:word|wd|phrase)?|secret|token|api[_-]?key|apikey|"
                r"access[_-]?key|private[_-]?key|auth)[\w.-]*[\"']?\s*[=:]\s*[\"']?)"
                r"([^\s\"'&,;]{3,})"), r"\1" + REDACTED),
]


def _secret_key(key: str) -> bool:
    """Whether values under ``key`` are redacted whole."""
    return _SECRET_KEY.search(key) is not None and not _CREDENTIAL_DIGEST_KEY.match(key)


def redact_text(text: str) -> str:
    """``text`` with secret-looking substrings replaced by ``[REDACTED]``."""
    for pattern, replacement in _SECRET_TEXT:
        text = pattern.sub(replacement, text)
    return text


def redact(obj: Any) -> Any:
    """A copy of a JSON-like value with secrets redacted: values under secret-looking keys, and
    secret-looking substrings of every string (best effort, by pattern)."""
    if isinstance(obj, dict):
        return {str(k): (REDACTED if _secret_key(str(k)) and v not in (None, "")
                         else redact(v)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def preview(obj: Any, limit: int = PREVIEW_CHARS) -> str:
    """Redacted JSON of ``obj``, cut to ``limit`` characters (``…`` marks a cut)."""
    text = json.dumps(redact(obj), sort_keys=True, ensure_ascii=False, default=_json_default)
    return text if len(text) <= limit else text[:limit] + "…"


def _cap(text: str | None, limit: int = MESSAGE_CHARS) -> str | None:
    if text is None:
        return None
    text = redact_text(text)
    return text if len(text) <= limit else text[:limit] + "…"


# ------------------------------------------------------------------ files


def rotated_files(path: Path) -> list[Path]:
    """The rotated files of ``path``, oldest first (``path.3``, ``path.2``, ``path.1``)."""
    found: list[tuple[int, Path]] = []
    try:
        for entry in path.parent.iterdir():
            suffix = entry.name[len(path.name) + 1:]
            if entry.name.startswith(path.name + ".") and suffix.isdigit():
                found.append((int(suffix), entry))
    except OSError:
        return []
    return [p for _, p in sorted(found, reverse=True)]


def chain_files(path: Path) -> list[Path]:
    """Every file of the chain, oldest first (rotated files, then ``path`` if it exists)."""
    base = path
    if path.suffix[1:].isdigit():  # given a rotated file: verify its whole chain
        base = path.with_suffix("")
    files = rotated_files(base)
    if base.exists():
        files.append(base)
    return files


@dataclass
class _Tail:
    good_size: int  # size up to and including the last newline
    last_line: bytes | None  # the last complete line (without newline)
    torn: bytes  # bytes after the last newline (a torn write)


def _read_tail(path: Path) -> _Tail:
    with path.open("rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return _Tail(0, None, b"")
        block = 64 * 1024
        start = size
        data = b""
        while True:
            start = max(0, start - block)
            fh.seek(start)
            data = fh.read(size - start)
            last_nl = data.rfind(b"\n")
            if last_nl >= 0 and (data.rfind(b"\n", 0, last_nl) >= 0 or start == 0):
                break
            if start == 0:
                break
            block *= 2
        last_nl = data.rfind(b"\n")
        if last_nl < 0:
            return _Tail(0, None, data)
        prev_nl = data.rfind(b"\n", 0, last_nl)
        return _Tail(start + last_nl + 1, data[prev_nl + 1:last_nl], data[last_nl + 1:])


def _first_line(path: Path) -> bytes | None:
    """The first complete line of a file (without newline), None if it has none."""
    try:
        with path.open("rb") as fh:
            line = fh.readline()
    except OSError:
        return None
    return line[:-1] if line.endswith(b"\n") else None


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------ the writer


class AuditLog:
    """An open, hash-chained audit log (continues the chain of an existing file)."""

    def __init__(self, path: Path, *, max_bytes: int = 64 * 1024 * 1024,
                 retention_files: int | None = None,
                 retention_days: float | None = None) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.retention_files = retention_files
        self.retention_days = retention_days
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._size = 0
        self._seq = -1
        self._prev = GENESIS
        self._broken: str | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                                    0o600)
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise AuditError(f"{self.path}: the audit log is in use by another "
                                 "process") from None
            torn = self._open()
            if not torn:
                self._prune()  # files that aged out while the daemon was stopped
        except OSError as exc:
            self.close()
            raise AuditError(f"{self.path}: cannot open the audit log: "
                             f"{exc.strerror or exc}") from exc
        except AuditError:
            self.close()
            raise
        if torn:
            try:
                self.write("audit_repaired", torn_bytes=len(torn),
                           torn_sha256=hashlib.sha256(torn).hexdigest(),
                           detail="an incomplete final line (crash mid-write) was removed")
                with self._lock:
                    self._prune()
            except AuditError:
                self.close()
                raise

    @property
    def seq(self) -> int:
        """Sequence number of the last record written (-1 for an empty chain)."""
        return self._seq

    @property
    def head(self) -> str:
        """SHA-256 of the last record (the ``prev`` of the next one)."""
        return self._prev

    def _open(self) -> bytes:
        """Open the current file, cut a torn tail, and find the chain's last record."""
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                           0o600)
        if created:
            _fsync_dir(self.path.parent)
        tail = _read_tail(self.path)
        if tail.torn:
            os.ftruncate(self._fd, tail.good_size)
            os.fsync(self._fd)
        self._size = tail.good_size
        last = tail.last_line
        if last is None:
            for older in reversed(rotated_files(self.path)):
                older_tail = _read_tail(older)
                if older_tail.last_line is not None:
                    last = older_tail.last_line
                    break
        if last is not None:
            try:
                record = json.loads(last)
                seq = record["seq"]
                if not isinstance(seq, int) or isinstance(seq, bool):
                    raise TypeError("seq")
            except (ValueError, KeyError, TypeError):
                raise AuditError(f"{self.path}: the last record is not a valid audit record; "
                                 "run `sandboxd audit verify` and move the damaged log "
                                 "aside") from None
            self._seq = seq
            self._prev = hashlib.sha256(last).hexdigest()
        return tail.torn

    def _rotate(self) -> None:
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        # shift oldest first so that no rename overwrites a file
        for older in rotated_files(self.path):
            n = int(older.name.rsplit(".", 1)[1])
            older.rename(older.with_name(f"{self.path.name}.{n + 1}"))
        self.path.rename(self.path.with_name(f"{self.path.name}.1"))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                           0o600)
        _fsync_dir(self.path.parent)
        self._size = 0

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one record and fsync it; return the record. Raises :class:`AuditError` on
        any failure (nothing is then left in the file)."""
        clash = RESERVED.intersection(fields)
        if clash:
            raise AuditError(f"reserved audit field(s): {', '.join(sorted(clash))}")
        try:
            clean = redact(json.loads(json.dumps(fields, default=_json_default)))
        except (TypeError, ValueError) as exc:
            raise AuditError(f"audit record {event!r} is not serialisable: {exc}") from exc
        with self._lock:
            if self._fd is None:
                raise AuditError(f"{self.path}: the audit log is closed")
            if self._broken:
                raise AuditError(f"{self.path}: the audit log is unusable: {self._broken}")
            full = storage.full_reason(self.path.parent, "audit log's filesystem")
            if full is not None:  # refused whole rather than failing half-way
                raise AuditError(full) from OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            record, data = self._build(event, clean)
            try:
                if self._size > 0 and self._size + len(data) > self.max_bytes:
                    self._rotate()
                    if self._prune():  # took a seq: the record follows the pruning record
                        record, data = self._build(event, clean)
            except OSError as exc:
                self._broken = f"rotation failed: {exc.strerror or exc}"
                with contextlib.suppress(OSError):
                    if self._fd is None:
                        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                        self._broken = None
                raise AuditError(f"{self.path}: cannot rotate the audit log: "
                                 f"{exc.strerror or exc}") from exc
            self._append(data)
            return record

    def _build(self, event: str, fields: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """The next record of the chain and its line (with newline); ``fields`` are redacted."""
        record: dict[str, Any] = {"ts": _now(), "seq": self._seq + 1, "event": event}
        record.update(fields)
        record["prev"] = self._prev
        try:
            line = json.dumps(record, separators=(",", ":"), ensure_ascii=False,
                              default=_json_default).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError) as exc:
            raise AuditError(f"audit record {event!r} is not serialisable: {exc}") from exc
        return record, line + b"\n"

    def _append(self, data: bytes) -> None:
        """Write one built line and fsync it, or leave the file as it was (lock held)."""
        assert self._fd is not None
        good = self._size
        try:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            os.fdatasync(self._fd)
        except OSError as exc:
            try:
                os.ftruncate(self._fd, good)
                os.fsync(self._fd)
            except OSError as exc2:
                self._broken = f"could not remove a partial record: {exc2.strerror or exc2}"
            raise AuditError(f"{self.path}: cannot write the audit log: "
                             f"{exc.strerror or exc}") from exc
        self._size += len(data)
        self._seq += 1
        self._prev = hashlib.sha256(data[:-1]).hexdigest()

    def _doomed(self) -> list[Path]:
        """The oldest rotated files the retention settings no longer keep (a prefix)."""
        if self.retention_files is None and self.retention_days is None:
            return []
        files = rotated_files(self.path)
        cutoff = (time.time() - self.retention_days * 86400
                  if self.retention_days is not None else None)
        doomed: list[Path] = []
        for index, f in enumerate(files):
            too_many = (self.retention_files is not None
                        and len(files) - index > self.retention_files)
            try:
                too_old = cutoff is not None and f.stat().st_mtime < cutoff
            except OSError:
                break
            if not (too_many or too_old):
                break
            doomed.append(f)
        return doomed

    def _prune(self) -> bool:
        """Apply the retention settings (lock held): record the anchor of what stays in an
        ``audit_pruned`` record, then delete the files. True when a record was written."""
        doomed = self._doomed()
        if not doomed:
            return False
        kept = [*rotated_files(self.path)[len(doomed):], self.path]
        first_kept = next((line for line in map(_first_line, kept) if line is not None), None)
        first_removed = _first_line(doomed[0])
        try:
            if first_kept is None:  # nothing kept yet: the anchor is the record written now
                anchor_seq, anchor_prev = self._seq + 1, self._prev
            else:
                record = json.loads(first_kept)
                anchor_seq, anchor_prev = int(record["seq"]), str(record["prev"])
            removed_from = (int(json.loads(first_removed)["seq"])
                            if first_removed is not None else None)
        except (ValueError, KeyError, TypeError):
            log.error("%s: audit retention skipped: the first record of a file to keep or to "
                      "remove is unreadable (run `sandboxd audit verify`)", self.path)
            return False
        fields = redact({
            "files": [f.name for f in doomed],
            "removed_seqs": [removed_from, anchor_seq - 1],
            "anchor_seq": anchor_seq, "anchor_prev": anchor_prev,
            "retention_files": self.retention_files, "retention_days": self.retention_days,
        })
        _, data = self._build("audit_pruned", fields)
        self._append(data)
        for f in doomed:
            try:
                f.unlink()
            except OSError as exc:
                log.error("%s: cannot delete the expired audit file: %s", f,
                          exc.strerror or exc)
                break
        with contextlib.suppress(OSError):
            _fsync_dir(self.path.parent)
        return True

    def decision(self, *, request_id: str, client: str, tool: str, session: str | None,
                 arguments: dict[str, Any], decision: Decision,
                 transport: str = "http") -> None:
        """Record a policy decision (before anything runs); ``transport``: the front door the
        call came through (``http``, ``mcp``)."""
        try:
            canonical = canonical_json(arguments)
        except (TypeError, ValueError) as exc:
            raise AuditError(f"arguments are not serialisable: {exc}") from exc
        fields: dict[str, Any] = {
            "request_id": request_id,
            "client": client,
            "tool": tool,
            "session": session,
            "transport": transport,
            "args_sha256": hashlib.sha256(canonical).hexdigest(),
            "args_bytes": len(canonical),
            "args_preview": preview(arguments),
            "decision": "allow" if decision.allowed else "deny",
            "source": decision.source,
            "rule": decision.rule,
            "policy": decision.policy_name,
            "backend": decision.backend,
            "limits": decision.limits.model_dump(mode="json") if decision.limits else None,
        }
        if decision.network:
            fields["network"] = decision.network
        if decision.allowed and decision.argv is not None:
            fields["argv_preview"] = preview(decision.argv)
        elif decision.allowed and decision.plan is not None:
            fields["plan_preview"] = _cap(decision.plan.render(), PREVIEW_CHARS)
        if not decision.allowed:
            fields["message"] = _cap(decision.message)
        self.write("decision", **fields)

    def result(self, *, request_id: str, client: str, result: Result,
               transport: str = "http") -> None:
        """Record the outcome of an invocation."""
        self.write(
            "result",
            request_id=request_id,
            client=client,
            transport=transport,
            tool=result.tool,
            invocation=result.id,
            session=result.session,
            backend=result.backend,
            status=result.status.value,
            termination=result.termination.model_dump(mode="json"),
            resources=result.resources.model_dump(mode="json"),
            limits=result.limits.model_dump(mode="json") if result.limits else None,
            rule=result.policy.rule if result.policy else None,
            stdout_bytes=len(result.stdout.encode("utf-8", "replace")),
            stderr_bytes=len(result.stderr.encode("utf-8", "replace")),
            truncated=result.truncated.model_dump(mode="json"),
            cleanup=result.cleanup.model_dump(mode="json"),
            message=_cap(result.message),
        )

    def close(self) -> None:
        """Close the file and release the lock (idempotent)."""
        with self._lock:
            for name in ("_fd", "_lock_fd"):
                fd = getattr(self, name)
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                    setattr(self, name, None)

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------ verification


@dataclass
class BadRecord:
    """Where the chain breaks."""

    file: Path
    line: int
    seq: int | None
    reason: str

    def __str__(self) -> str:
        seq = f" (seq {self.seq})" if self.seq is not None else ""
        return f"{self.file}:{self.line}{seq}: {self.reason}"


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`."""

    ok: bool
    records: int = 0
    files: list[Path] = field(default_factory=list)
    head_seq: int | None = None
    head_hash: str | None = None
    first_bad: BadRecord | None = None
    warnings: list[str] = field(default_factory=list)
    anchor_seq: int | None = None  # first seq when older records were removed by retention
    anchored_by: int | None = None  # seq of the audit_pruned record that names that anchor

    def summary(self) -> str:
        """One line for humans."""
        if not self.ok:
            return f"FAILED: {self.first_bad}"
        files = f"{len(self.files)} file{'s' if len(self.files) != 1 else ''}"
        head = (f"; head seq {self.head_seq} sha256 {self.head_hash}"
                if self.head_seq is not None else "")
        start = (f"; starts at seq {self.anchor_seq} (older records removed by retention, "
                 f"recorded at seq {self.anchored_by})" if self.anchor_seq is not None else "")
        return f"ok: {self.records} records in {files}{head}{start}"


def verify(path: Path) -> VerifyReport:
    """Check the whole chain of ``path`` (its rotated files first). Names the first bad record."""
    path = Path(path)
    files = chain_files(path)
    report = VerifyReport(ok=True, files=files)
    if not files:
        report.ok = False
        report.first_bad = BadRecord(path, 0, None, "no such audit log")
        return report
    prev_hash = GENESIS
    expected = 0
    prev_where: tuple[Path, int] | None = None
    anchor: tuple[int, str, Path, int] | None = None  # first record, when not the genesis

    def fail(f: Path, line: int, seq: int | None, reason: str) -> VerifyReport:
        report.ok = False
        report.first_bad = BadRecord(f, line, seq, reason)
        return report

    for index, f in enumerate(files):
        last_file = index == len(files) - 1
        try:
            fh = f.open("rb")
        except OSError as exc:
            return fail(f, 0, None, f"cannot read: {exc.strerror or exc}")
        with fh:
            pending: bytes | None = None
            lineno = 0
            for raw in fh:
                if pending is not None:  # a line without newline that is not the last
                    return fail(f, lineno, None, "incomplete line in the middle of the log")
                lineno += 1
                if not raw.endswith(b"\n"):
                    pending = raw
                    continue
                line = raw[:-1]
                try:
                    record = json.loads(line)
                    seq = record["seq"]
                    prev = record["prev"]
                    if (not isinstance(seq, int) or isinstance(seq, bool)
                            or not isinstance(prev, str) or not isinstance(record["event"], str)):
                        raise TypeError
                except (ValueError, KeyError, TypeError):
                    return fail(f, lineno, None, "not a valid audit record (edited or corrupt)")
                if prev_where is None:
                    if seq != 0 or prev != GENESIS:
                        anchor = (seq, prev, f, lineno)  # an audit_pruned record must name it
                else:
                    pf, pl = prev_where
                    if seq > expected:
                        return fail(f, lineno, seq, f"seq jumps from {expected - 1} to {seq}: "
                                    f"{seq - expected} record(s) removed before this one")
                    if seq < expected:
                        return fail(f, lineno, seq, f"seq {seq} follows seq {expected - 1}: a "
                                    "record was inserted or records were reordered")
                    if prev != prev_hash:
                        return fail(pf, pl, expected - 1, f"the record was altered: its hash "
                                    f"does not match the prev stored by the next record "
                                    f"({f}:{lineno}); or that next record was forged")
                if (anchor is not None and report.anchored_by is None
                        and record["event"] == "audit_pruned"
                        and record.get("anchor_seq") == anchor[0]
                        and record.get("anchor_prev") == anchor[1]):
                    report.anchor_seq, report.anchored_by = anchor[0], seq
                prev_hash = hashlib.sha256(line).hexdigest()
                expected = seq + 1
                prev_where = (f, lineno)
                report.records += 1
                report.head_seq = seq
                report.head_hash = prev_hash
            if pending is not None:
                if not last_file:
                    return fail(f, lineno, None, "incomplete last line in a rotated file")
                report.warnings.append(
                    f"{f}:{lineno}: incomplete final line ({len(pending)} bytes, a crash "
                    "mid-write; that record was never acknowledged). It is removed, and the "
                    "removal recorded, the next time the daemon opens the log.")
    if anchor is not None and report.anchored_by is None:
        seq, _, f, lineno = anchor
        return fail(f, lineno, seq, f"the chain does not start here (first seq is {seq}): "
                    "earlier records were removed (the head of the log, or older rotated "
                    "files), and no audit_pruned record of the retention names this record "
                    "as the new start")
    return report


# ------------------------------------------------------------------ reading


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete, parseable record of the chain, oldest first (for ``audit tail``)."""
    for f in chain_files(path):
        try:
            fh = f.open("rb")
        except OSError:
            continue
        with fh:
            for raw in fh:
                if not raw.endswith(b"\n"):
                    break
                with contextlib.suppress(ValueError):
                    record = json.loads(raw)
                    if isinstance(record, dict):
                        yield record


def follow(path: Path, interval_s: float = 0.5) -> Iterator[dict[str, Any]]:
    """Records appended to ``path`` from the moment of this call (the position is taken now,
    not at the first ``next()``). Survives rotation: when the file was rotated (possibly
    several times) between two polls, the rest of the old file and every file rotated since
    are read before the new current file."""
    fh = None
    inode: int | None = None
    with contextlib.suppress(FileNotFoundError):
        fh = path.open("rb")
        fh.seek(0, os.SEEK_END)
        inode = os.fstat(fh.fileno()).st_ino
    return _follow(path, interval_s, fh, inode)


def _follow(path: Path, interval_s: float, fh: Any, inode: int | None
            ) -> Iterator[dict[str, Any]]:
    buf = b""

    def parse(data: bytes) -> Iterator[dict[str, Any]]:
        for raw in data.split(b"\n"):
            if raw.strip():
                with contextlib.suppress(ValueError):
                    yield json.loads(raw)

    while True:
        try:
            ino: int | None = os.stat(path).st_ino
        except FileNotFoundError:
            ino = None
        if ino is not None and ino != inode:
            if fh is None:
                fh = path.open("rb")  # created after we started: read it from the start
            else:
                yield from parse(buf + fh.read())
                fh.close()
                newer = False
                for older in chain_files(path)[:-1]:  # rotated files, oldest first
                    try:
                        older_ino = os.stat(older).st_ino
                    except FileNotFoundError:
                        continue
                    if newer:
                        yield from parse(older.read_bytes())
                    elif older_ino == inode:
                        newer = True
                fh = path.open("rb")
            inode, buf = ino, b""
        if fh is not None:
            chunk = fh.read()
            if chunk:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                yield from parse(b"\n".join(lines))
                continue
        time.sleep(interval_s)
