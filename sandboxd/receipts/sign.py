"""Signing: a result's receipt, and the audit log's signed heads.

:class:`Receipts` is the daemon's: it signs each result right after the result's audit record
is written (:meth:`AuditRecorder.result <sandboxd.receipts.recorder.AuditRecorder.result>`),
with the
seq and hash of that record, and it appends a signed head of the audit chain to
``<audit log>.heads`` periodically and when the log closes, so that records cut from the end
of the log are found (:mod:`sandboxd.receipts.heads`)."""

from __future__ import annotations

import base64
import contextvars
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxd.audit.encoding import canonical_json
from sandboxd.models import Decision, Result
from sandboxd.receipts.canonical import RECEIPT_TYPE, result_hashes, signed_bytes
from sandboxd.receipts.heads import HEAD_TYPE, heads_path
from sandboxd.receipts.keys import SigningKey
from sandboxd.util.timefmt import utc_iso

log = logging.getLogger("sandboxd.receipts")

#: the heads file is cut back to its newest :data:`HEADS_KEPT` lines past this size (only the
#: newest head is checked; one a minute would otherwise grow it by ~130 MB a year)
HEADS_MAX_BYTES = 1024 * 1024
HEADS_KEPT = 100


@dataclass(frozen=True)
class CallFacts:
    """What a call's receipt needs from its decision record (noted when it is written)."""

    request_id: str
    args_sha256: str | None
    policy_sha256: str | None


#: the facts of the call this task is running: set when its decision record is written, read
#: when its result is signed (both in the call's own task)
CALL: contextvars.ContextVar[CallFacts | None] = contextvars.ContextVar("receipt_call",
                                                                        default=None)


def note_decision(request_id: str, args_sha256: str | None, decision: Decision) -> None:
    """Remember what the receipt of call ``request_id`` takes from its decision."""
    CALL.set(CallFacts(request_id, args_sha256, decision.policy_sha256 or None))


class Receipts:
    """The daemon's signer (one key, one audit log)."""

    def __init__(self, key: SigningKey, audit_path: Path, head_interval_s: float) -> None:
        self.key = key
        self.heads = heads_path(audit_path)
        #: how often the audit log's head is signed while it changes (always when it closes)
        self.head_interval_s = head_interval_s
        self._signed_head: tuple[int, str] | None = None
        self._head_due = time.monotonic() + head_interval_s

    @classmethod
    def open(cls, state_dir: Path, audit_path: Path, head_interval_s: float = 60.0) -> Receipts:
        """The signer of a state directory's key (made at first start) and audit log."""
        return cls(SigningKey.open(state_dir), audit_path, head_interval_s)

    def _sign(self, record: dict[str, Any]) -> dict[str, Any]:
        record["key_id"] = self.key.key_id
        record["signature"] = base64.b64encode(self.key.sign(signed_bytes(record))).decode()
        return record

    def receipt(self, client: str, result: Result, transport: str, admitted: float,
                audit: tuple[int, str]) -> dict[str, Any]:
        """The signed receipt of ``result`` (its result record is ``audit``: seq, sha256);
        ``admitted``: when the call was admitted (``time.monotonic()``)."""
        ended = time.time()
        facts = CALL.get()
        if facts is not None and facts.request_id != result.id:
            facts = None
        policy = result.policy
        wire = result.wire()  # the result as its client gets it (limits in their wire form)
        record: dict[str, Any] = {
            "type": RECEIPT_TYPE,
            "id": result.id, "client": client, "tool": result.tool, "session": result.session,
            "transport": transport,
            "args_sha256": facts.args_sha256 if facts else None,
            "policy": None if policy is None else {
                "source": policy.source, "rule": policy.rule, "decision": policy.decision,
                "sha256": facts.policy_sha256 if facts else None},
            "backend": result.backend, "node": result.node,
            "limits": wire.get("limits"),
            "status": result.status.value,
            **result_hashes(wire),
            "started": utc_iso(ended - max(time.monotonic() - admitted, 0.0)),
            "ended": utc_iso(ended),
            "audit": {"seq": audit[0], "sha256": audit[1]},
        }
        return self._sign(record)

    # ------------------------------------------------------------ signed heads

    def head_due(self) -> bool:
        """Whether the periodic signed head is due."""
        return time.monotonic() >= self._head_due

    def sign_head(self, seq: int, sha256: str, reason: str) -> None:
        """Append a signed head (``seq``, ``sha256``: the last durable record) to the heads
        file and sync it; nothing when that head is already signed or the chain is empty."""
        self._head_due = time.monotonic() + self.head_interval_s
        if seq < 0 or self._signed_head == (seq, sha256):
            return
        record = self._sign({"type": HEAD_TYPE, "seq": seq, "sha256": sha256,
                             "ts": utc_iso(), "reason": reason})
        line = canonical_json(record) + b"\n"
        fd = os.open(self.heads, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line)
            os.fdatasync(fd)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        self._signed_head = (seq, sha256)
        if size > HEADS_MAX_BYTES:
            self._cut_heads()

    def _cut_heads(self) -> None:
        """Keep the newest heads only (a new file renamed over the old one, both synced)."""
        kept = self.heads.read_bytes().splitlines(keepends=True)[-HEADS_KEPT:]
        tmp = self.heads.with_name(f".{self.heads.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, b"".join(kept))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.heads)
        dfd = os.open(self.heads.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
