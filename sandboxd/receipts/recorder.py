"""The service's audit bookkeeping: no unaudited execution, and no result lost.

:meth:`AuditRecorder.record` writes a record on the audit writer thread (fsync must not stall
other calls; concurrent records share one: :mod:`sandboxd.audit.thread`) and turns a failure
into :class:`~sandboxd.errors.AuditFailure`. A call that already ran
when the log failed keeps its result (:meth:`keep`); kept results are written late, first
thing, as soon as the log is writable again (:meth:`problem`, :meth:`watch`). At start-up,
:func:`interrupted_calls` finds the calls a previous daemon never finished recording.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sandboxd.audit import AuditLog
from sandboxd.audit.thread import AuditThread
from sandboxd.errors import AuditFailure
from sandboxd.host.storage import full_reason, is_no_space
from sandboxd.models import Result
from sandboxd.receipts.sign import Receipts, note_decision

log = logging.getLogger("sandboxd")


class AuditRecorder:
    """Writes the service's audit records and keeps what could not be written yet."""

    def __init__(self, audit: AuditLog, receipts: Receipts | None = None) -> None:
        self.audit = audit
        #: the signer of results' receipts and of the log's heads (None: no receipts)
        self.receipts = receipts
        if receipts is not None:  # the head as the log closes is signed (the stop's head)
            audit.on_close = lambda seq, head: receipts.sign_head(seq, head, "close")
        #: results of calls that ran while the log could not be written: written late
        self.unrecorded: list[tuple[str, Result, str]] = []
        #: why the log cannot be written (None: it can)
        self.failed: str | None = None
        self.writer = AuditThread(audit)

    async def record(self, write: Callable[..., Any], **fields: Any) -> Any:
        """Write one record (kept results first); :class:`AuditFailure` when it fails.
        Returns what ``write`` returned. A call's decision record also notes, for the call's
        receipt, the arguments' hash and the policy's (:func:`note_decision`)."""
        try:
            if self.unrecorded:
                await asyncio.to_thread(self.flush)
            value = await self.writer.run(write, **fields)
        except Exception as exc:
            log.error("audit write failed: %s", exc)
            self.failed = str(exc)
            raise AuditFailure(
                "the audit log could not be written, so the call was refused (nothing ran); "
                f"the administrator must fix the audit log: {exc}", storage=is_no_space(exc),
            ) from exc
        self.failed = None
        if write == self.audit.decision and self.receipts is not None:
            note_decision(fields["request_id"], value, fields["decision"])
        return value

    async def result(self, client: str, result: Result, admitted: float,
                     transport: str) -> None:
        """Write the result record of a call, then sign its receipt (``result.receipt``) with
        that record's seq and hash: the chain head that includes this result."""
        audit = await self.record(self.audit.result, request_id=result.id, client=client,
                                  result=result, transport=transport)
        if self.receipts is None:
            return
        try:
            result.receipt = self.receipts.receipt(client, result, transport, admitted, audit)
        except Exception:  # the call is audited: its client hears the result all the same
            log.exception("the receipt of %s could not be signed", result.id)

    def close(self) -> None:
        """Stop the writer thread once what is queued is written (before the log closes)."""
        self.writer.close()

    def keep(self, client: str, result: Result, transport: str,
             cause: AuditFailure) -> AuditFailure:
        """Keep the result of a call that ran, and the error that says so (with the result)."""
        self.unrecorded.append((client, result, transport))
        return AuditFailure(
            f"the call ran (status {result.status.value}) but its result could not be written "
            f"to the audit log ({self.failed}); it is written there as soon as the log is "
            "writable again; the result is attached", storage=cause.storage, result=result)

    def flush(self) -> None:
        """Write the kept results (raises while the log still fails)."""
        while self.unrecorded:
            client, result, transport = self.unrecorded[0]
            self.audit.result(request_id=result.id, client=client, result=result,
                              transport=transport)
            self.unrecorded.pop(0)

    def problem(self) -> str | None:
        """Why the audit log cannot be written now (None: it can). After a failure, writing
        the kept results (or an ``audit_recovered`` record) is the proof that it can again."""
        full = full_reason(self.audit.path.parent, "audit log's filesystem")
        if full is not None:
            return full
        if self.failed is None and not self.unrecorded:
            return None
        try:
            self.flush()
            self.audit.write("audit_recovered", detail=self.failed)
        except Exception as exc:
            self.failed = str(exc)
            return f"the audit log cannot be written: {exc}"
        log.warning("the audit log is writable again")
        self.failed = None
        return None

    async def watch(self, interval_s: float = 1.0) -> None:
        """Forever: once the log failed, retry until it works (kept results written late)."""
        while True:
            await asyncio.sleep(interval_s)
            if self.failed is not None or self.unrecorded:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.problem)
            elif self.receipts is not None and self.receipts.head_due():
                await asyncio.to_thread(self._sign_head)

    def _sign_head(self) -> None:
        """Sign the log's head (periodic); a failure is logged and tried again next time."""
        assert self.receipts is not None
        try:
            self.receipts.sign_head(*self.audit.durable_head(), "periodic")
        except Exception as exc:
            log.error("the audit log's head could not be signed: %s", exc)


def interrupted_calls(audit_path: Path) -> list[str]:
    """Request ids with an allowing decision but no result and not yet reported as
    interrupted, whatever the shutdown was (a crash, or a clean stop while the audit log could
    not take their results)."""
    open_calls: dict[str, None] = {}
    for record in _tail_records(audit_path):
        event = record.get("event")
        rid = record.get("request_id")
        if event == "interrupted":
            for reported in record.get("requests") or ():
                open_calls.pop(reported, None)
        elif event == "decision" and rid and record.get("decision") == "allow":
            open_calls[rid] = None
        elif event == "result" and rid:
            open_calls.pop(rid, None)
    return list(open_calls)


def _tail_records(audit_path: Path) -> Iterator[Any]:
    """The records of the audit log's last 4 MiB that parse as JSON (none when it cannot be
    read): a record cut at the start of the tail is skipped."""
    try:
        with open(audit_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 4 * 1024 * 1024))
            lines = fh.read().splitlines()
    except OSError:
        return
    for line in lines:
        try:
            yield json.loads(line)
        except ValueError:
            continue
