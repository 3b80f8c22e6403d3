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

Modules: ``writer`` (:class:`AuditLog`), ``encoding`` (canonical JSON, digests, redaction),
``files`` (the chain's files), ``reader`` (:func:`verify`, :func:`read_records`,
:func:`follow`).
"""

from __future__ import annotations

from sandboxd.audit.encoding import (
    MESSAGE_CHARS,
    PREVIEW_CHARS,
    REDACTED,
    canonical_json,
    digest,
    preview,
    redact,
    redact_text,
)
from sandboxd.audit.files import GENESIS, chain_files, rotated_files
from sandboxd.audit.reader import BadRecord, VerifyReport, follow, read_records, verify
from sandboxd.audit.writer import RESERVED, AuditError, AuditLog

__all__ = [
    "GENESIS", "MESSAGE_CHARS", "PREVIEW_CHARS", "REDACTED", "RESERVED", "AuditError",
    "AuditLog", "BadRecord", "VerifyReport", "canonical_json", "chain_files", "digest",
    "follow", "preview", "read_records", "redact", "redact_text", "rotated_files", "verify",
]
