"""The writer of the audit log: the hash-chained, fsynced append, rotation by size, retention
(with its ``audit_pruned`` anchor) and the repair of a torn final line.

Group commit: a record is appended under the lock, then made durable outside it; writers that
wait meanwhile share the next ``fdatasync`` (one for all of them, in append order). A record
written with ``durable=False`` (an allowed decision of a non-streaming call) is on disk as soon
as any later record is committed: the call's result record, before the client gets it."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sandboxd.audit.encoding import (
    canonical_json,
    json_default,
    redact,
)
from sandboxd.audit.files import GENESIS, first_line, fsync_dir, read_tail, rotated_files
from sandboxd.audit.records import decision_fields, result_fields
from sandboxd.errors import SandboxdError
from sandboxd.host import storage
from sandboxd.models import Decision, Result
from sandboxd.util.timefmt import utc_iso

RESERVED = frozenset({"ts", "seq", "event", "prev"})

log = logging.getLogger("sandboxd.audit")


class AuditError(SandboxdError):
    """The audit log cannot be written (the call that needed the record must fail)."""

    code = "audit-unwritable"


def _now() -> str:
    return utc_iso()


def _clean_fields(event: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A record's own fields as JSON values, redacted; :class:`AuditError` for a reserved
    name or a value that cannot be serialised."""
    clash = RESERVED.intersection(fields)
    if clash:
        raise AuditError(f"reserved audit field(s): {', '.join(sorted(clash))}")
    try:
        clean: dict[str, Any] = redact(json.loads(json.dumps(fields, default=json_default)))
    except (TypeError, ValueError) as exc:
        raise AuditError(f"audit record {event!r} is not serialisable: {exc}") from exc
    return clean


def _chain_seq(path: Path, last: bytes) -> int:
    """The ``seq`` of the chain's last record ``last`` (:class:`AuditError` when it is not a
    valid audit record)."""
    try:
        seq = json.loads(last)["seq"]
        if type(seq) is not int:  # not isinstance(): true and false are ints to it
            raise TypeError("seq")
    except (ValueError, KeyError, TypeError):
        raise AuditError(f"{path}: the last record is not a valid audit record; "
                         "run `sandboxd audit verify` and move the damaged log "
                         "aside") from None
    return seq


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
        # group commit: records appended since open, and the last one known durable
        self._appended = 0
        self._synced = 0
        self._syncing = False
        self._sync_cond = threading.Condition(threading.Lock())
        # the tickets of the durable records a thread appends under held_commits()
        self._held = threading.local()
        #: called with the last durable record's seq and hash when the log closes
        self.on_close: Callable[[int, str], None] | None = None
        try:
            self._take_lock()
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
            self._record_repair(torn)

    def _take_lock(self) -> None:
        """Hold the log's lock file: one process at a time writes a log."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                                0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AuditError(f"{self.path}: the audit log is in use by another "
                             "process") from None

    def _record_repair(self, torn: bytes) -> None:
        """Record the removal of a torn final line, then apply retention (held back until
        the removal was recorded); the log is closed when either fails."""
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
            fsync_dir(self.path.parent)
        tail = read_tail(self.path)
        if tail.torn:
            os.ftruncate(self._fd, tail.good_size)
            os.fsync(self._fd)
        self._size = tail.good_size
        # an empty current file: the chain ends in the newest rotated one
        last = tail.last_line if tail.last_line is not None else self._last_rotated_line()
        if last is not None:
            self._seq = _chain_seq(self.path, last)
            self._prev = hashlib.sha256(last).hexdigest()
        return tail.torn

    def _last_rotated_line(self) -> bytes | None:
        """The last record of the newest rotated file that holds one (None: none does)."""
        lines = (read_tail(f).last_line for f in reversed(rotated_files(self.path)))
        return next((line for line in lines if line is not None), None)

    def _rotate(self) -> None:
        assert self._fd is not None
        os.fdatasync(self._fd)  # the records not yet committed stay durable in the old file
        os.close(self._fd)
        self._fd = None
        # shift oldest first so that no rename overwrites a file
        for older in rotated_files(self.path):
            n = int(older.name.rsplit(".", 1)[1])
            older.rename(older.with_name(f"{self.path.name}.{n + 1}"))
        self.path.rename(self.path.with_name(f"{self.path.name}.1"))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                           0o600)
        fsync_dir(self.path.parent)
        self._size = 0

    def write(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one record and fsync it; return the record. Raises :class:`AuditError` on
        any failure (nothing is then left in the file)."""
        return self._write(event, fields, durable=True)[0]

    def _write(self, event: str, fields: dict[str, Any], *,
               durable: bool) -> tuple[dict[str, Any], str]:
        """:meth:`write`, and the SHA-256 of the record's line (the chain's head once it is
        written); ``durable=False``: appended (it survives a crash of the daemon) and made
        durable by the next committed record."""
        clean = _clean_fields(event, fields)
        with self._lock:
            self._check_writable()
            record, data = self._build(event, clean)
            if self._size > 0 and self._size + len(data) > self.max_bytes:
                record, data = self._rotate_before(event, clean, record, data)
            ticket = self._append(data)
            head = self._prev
        if durable:
            held: list[int] | None = getattr(self._held, "tickets", None)
            if held is None:
                self._commit(ticket)
            else:
                held.append(ticket)
        return record, head

    def _check_writable(self) -> None:
        """Refuse a record (lock held) while the log is closed, unusable, or its filesystem
        full (refused whole rather than failing half-way)."""
        if self._fd is None:
            raise AuditError(f"{self.path}: the audit log is closed")
        if self._broken:
            raise AuditError(f"{self.path}: the audit log is unusable: {self._broken}")
        full = storage.full_reason(self.path.parent, "audit log's filesystem")
        if full is not None:
            raise AuditError(full) from OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def _rotate_before(self, event: str, clean: dict[str, Any], record: dict[str, Any],
                       data: bytes) -> tuple[dict[str, Any], bytes]:
        """Rotate before a record that would overflow the file (lock held), then prune; the
        record rebuilt when the pruning record took its seq. A failed rotation leaves the log
        unusable unless the current file can be reopened."""
        try:
            self._rotate()
            if self._prune():  # took a seq: the record follows the pruning record
                return self._build(event, clean)
        except OSError as exc:
            self._broken = f"rotation failed: {exc.strerror or exc}"
            self._reopen()
            raise AuditError(f"{self.path}: cannot rotate the audit log: "
                             f"{exc.strerror or exc}") from exc
        return record, data

    def _reopen(self) -> None:
        """After a failed rotation (lock held): reopen the current file if the rotation left
        none open, and only then is the log usable again."""
        with contextlib.suppress(OSError):
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                self._broken = None

    def durable_head(self) -> tuple[int, str]:
        """The seq and SHA-256 of the last record, once it is durable (what a signed head
        may name: a record lost in a power cut would read as one cut from the log)."""
        with self._lock:
            seq, head, ticket = self._seq, self._prev, self._appended
        if ticket:
            self._commit(ticket)
        return seq, head

    @contextlib.contextmanager
    def held_commits(self) -> Iterator[list[int]]:
        """Within it, on this thread, a durable record's write returns once the record is
        appended and puts its commit ticket in the yielded list: the caller must
        :meth:`commit` the highest one before it tells anyone that the record is written
        (the audit writer thread's batch: :mod:`sandboxd.audit.thread`)."""
        tickets: list[int] = []
        self._held.tickets = tickets
        try:
            yield tickets
        finally:
            self._held.tickets = None

    def commit(self, ticket: int) -> None:
        """Return once the record ``ticket`` (from :meth:`held_commits`) and every record
        before it are durable; :class:`AuditError` when the sync fails."""
        self._commit(ticket)

    def _commit(self, ticket: int) -> None:
        """Return once the record ``ticket`` (and every one before it) is durable: one
        ``fdatasync`` covers every record appended before it started. A failed sync makes
        the log unusable (what the kernel kept of the records is unknown)."""
        if not self._lead_sync(ticket):
            return
        upto = 0
        try:
            with self._lock:
                if self._fd is None:
                    raise AuditError(f"{self.path}: the audit log is closed")
                upto, fd = self._appended, os.dup(self._fd)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            upto = 0
            with self._lock:
                self._broken = f"fsync failed: {exc.strerror or exc}"
            raise AuditError(f"{self.path}: cannot write the audit log: "
                             f"{exc.strerror or exc}") from exc
        finally:
            with self._sync_cond:
                self._synced = max(self._synced, upto)
                self._syncing = False
                self._sync_cond.notify_all()

    def _lead_sync(self, ticket: int) -> bool:
        """Wait until the record ``ticket`` is durable (False), or until no sync runs (True:
        this thread runs the next one); :class:`AuditError` once the log is unusable."""
        with self._sync_cond:
            while self._synced < ticket:
                if self._broken:
                    raise AuditError(f"{self.path}: the audit log is unusable: {self._broken}")
                if not self._syncing:
                    self._syncing = True
                    return True
                self._sync_cond.wait()
        return False

    def _build(self, event: str, fields: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """The next record of the chain and its line (with newline); ``fields`` are redacted."""
        record: dict[str, Any] = {"ts": _now(), "seq": self._seq + 1, "event": event}
        record.update(fields)
        record["prev"] = self._prev
        try:
            line = json.dumps(record, separators=(",", ":"), ensure_ascii=False,
                              default=json_default).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError) as exc:
            raise AuditError(f"audit record {event!r} is not serialisable: {exc}") from exc
        return record, line + b"\n"

    def _append(self, data: bytes) -> int:
        """Write one built line, or leave the file as it was (lock held); its commit ticket."""
        assert self._fd is not None
        try:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError as exc:
            self._cut_partial()
            raise AuditError(f"{self.path}: cannot write the audit log: "
                             f"{exc.strerror or exc}") from exc
        self._size += len(data)
        self._seq += 1
        self._prev = hashlib.sha256(data[:-1]).hexdigest()
        self._appended += 1
        return self._appended

    def _cut_partial(self) -> None:
        """Cut what a failed write left of a record (lock held); the log is unusable when
        that fails too."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, self._size)
            os.fsync(self._fd)
        except OSError as exc:
            self._broken = f"could not remove a partial record: {exc.strerror or exc}"

    def _doomed(self) -> list[Path]:
        """The oldest rotated files the retention settings no longer keep (a prefix)."""
        files = rotated_files(self.path)
        # the files before index ``over`` are too many; any file may be too old
        over = len(files) - self.retention_files if self.retention_files is not None else 0
        cutoff = (time.time() - self.retention_days * 86400
                  if self.retention_days is not None else None)
        doomed: list[Path] = []
        for index, f in enumerate(files):
            try:
                too_old = cutoff is not None and f.stat().st_mtime < cutoff
            except OSError:
                break
            if index >= over and not too_old:
                break
            doomed.append(f)
        return doomed

    def _prune(self) -> bool:
        """Apply the retention settings (lock held): record the anchor of what stays in an
        ``audit_pruned`` record, then delete the files. True when a record was written."""
        doomed = self._doomed()
        if not doomed:
            return False
        anchor = self._anchor(doomed)
        if anchor is None:
            log.error("%s: audit retention skipped: the first record of a file to keep or to "
                      "remove is unreadable (run `sandboxd audit verify`)", self.path)
            return False
        anchor_seq, anchor_prev, removed_from = anchor
        fields = redact({
            "files": [f.name for f in doomed],
            "removed_seqs": [removed_from, anchor_seq - 1],
            "anchor_seq": anchor_seq, "anchor_prev": anchor_prev,
            "retention_files": self.retention_files, "retention_days": self.retention_days,
        })
        _, data = self._build("audit_pruned", fields)
        self._append(data)
        assert self._fd is not None
        os.fdatasync(self._fd)  # durable before any file goes
        self._delete(doomed)
        return True

    def _delete(self, doomed: list[Path]) -> None:
        """Delete the files retention dropped, oldest first, stopping at the first that
        resists (what stays is still a chain); the deletions made durable."""
        for f in doomed:
            try:
                f.unlink()
            except OSError as exc:
                log.error("%s: cannot delete the expired audit file: %s", f,
                          exc.strerror or exc)
                break
        with contextlib.suppress(OSError):
            fsync_dir(self.path.parent)

    def _anchor(self, doomed: list[Path]) -> tuple[int, str, int | None] | None:
        """What an ``audit_pruned`` record names: the seq and ``prev`` of the first record
        kept (the record written now when no file kept holds one yet) and the first seq
        removed; None when one of those first records is unreadable."""
        kept = [*rotated_files(self.path)[len(doomed):], self.path]
        first_kept = next((line for line in map(first_line, kept) if line is not None), None)
        first_removed = first_line(doomed[0])
        try:
            removed_from = (int(json.loads(first_removed)["seq"])
                            if first_removed is not None else None)
            if first_kept is None:  # nothing kept yet: the anchor is the record written now
                return self._seq + 1, self._prev, removed_from
            record = json.loads(first_kept)
            return int(record["seq"]), str(record["prev"]), removed_from
        except (ValueError, KeyError, TypeError):
            return None

    def decision(self, *, request_id: str, client: str, tool: str, session: str | None,
                 arguments: dict[str, Any], decision: Decision,
                 transport: str = "http", commit_with_result: bool = False) -> str:
        """Record a policy decision (before anything runs); ``transport``: the front door the
        call came through (``http``, ``mcp``). ``commit_with_result``: an allowed decision is
        appended now and made durable with the call's result record (one fsync per call);
        only for a call whose client gets nothing before that result. Returns the arguments'
        SHA-256 (the call's receipt names it)."""
        try:
            canonical = canonical_json(arguments)
        except (TypeError, ValueError) as exc:
            raise AuditError(f"arguments are not serialisable: {exc}") from exc
        fields = decision_fields(request_id=request_id, client=client, tool=tool,
                                 session=session, arguments=arguments, canonical=canonical,
                                 decision=decision, transport=transport)
        self._write("decision", fields,
                    durable=not (commit_with_result and decision.allowed))
        return str(fields["args_sha256"])

    def result(self, *, request_id: str, client: str, result: Result,
               transport: str = "http") -> tuple[int, str]:
        """Record the outcome of an invocation; returns the record's seq and SHA-256 (the
        chain's head that includes it: the call's receipt names it)."""
        fields = result_fields(request_id=request_id, client=client, result=result,
                               transport=transport)
        record, head = self._write("result", fields, durable=True)
        return record["seq"], head

    def close(self) -> None:
        """Close the file and release the lock (idempotent); the last head is handed to
        :attr:`on_close` first (the receipts sign it)."""
        self._hand_over_head()
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):  # records appended without a commit
                    os.fdatasync(self._fd)
            for fd in (self._fd, self._lock_fd):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._fd = self._lock_fd = None

    def _hand_over_head(self) -> None:
        """Give :attr:`on_close` the last durable head of a log still usable; a failure is
        logged (the log closes all the same)."""
        if self.on_close is not None and self._fd is not None and not self._broken:
            try:
                self.on_close(*self.durable_head())
            except Exception:  # the daemon's log says why
                log.exception("%s: the audit log's final head could not be signed", self.path)

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
