"""Reading the audit log: :func:`verify` checks the whole chain; :func:`read_records` and
:func:`follow` give its records (``sandboxd audit verify`` / ``tail``)."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxd.audit.files import GENESIS, chain_files


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
    signed_seq: int | None = None  # the signed head the chain was checked against
    missing: int | None = None  # records cut from the end: how many up to the signed head

    def summary(self) -> str:
        """One line for humans."""
        if not self.ok:
            return f"FAILED: {self.first_bad}"
        files = f"{len(self.files)} file{'s' if len(self.files) != 1 else ''}"
        facts = (  # each said when it is known
            (self.head_seq, f"; head seq {self.head_seq} sha256 {self.head_hash}"),
            (self.anchor_seq, f"; starts at seq {self.anchor_seq} (older records removed by "
                              f"retention, recorded at seq {self.anchored_by})"),
            (self.signed_seq, f"; matches the signed head at seq {self.signed_seq}"),
        )
        known = "".join(text for value, text in facts if value is not None)
        return f"ok: {self.records} records in {files}{known}"


class _Broken(Exception):
    """The chain breaks at :attr:`bad`."""

    def __init__(self, file: Path, line: int, seq: int | None, reason: str) -> None:
        super().__init__(reason)
        self.bad = BadRecord(file, line, seq, reason)


def _parsed(f: Path, lineno: int, line: bytes) -> tuple[dict[str, Any], int, str]:
    """A record and its seq and prev, or :class:`_Broken` when it is not a valid record."""
    try:
        record = json.loads(line)
        seq, prev = record["seq"], record["prev"]
        # type() and not isinstance(): JSON's true and false are ints to isinstance
        if type(seq) is not int or not isinstance(prev, str) or not isinstance(
                record["event"], str):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise _Broken(f, lineno, None, "not a valid audit record (edited or corrupt)") from None
    return record, seq, prev


class _Chain:
    """The walk of :func:`verify`: each record checked against the one before it."""

    def __init__(self, report: VerifyReport, signed_head: tuple[int, str] | None) -> None:
        self.report, self.signed_head = report, signed_head
        self.prev_hash, self.expected = GENESIS, 0
        self.prev_where: tuple[Path, int] | None = None
        self.anchor: tuple[int, str, Path, int] | None = None  # first record, if not genesis

    def file(self, f: Path, last_file: bool) -> None:
        try:
            fh = f.open("rb")
        except OSError as exc:
            raise _Broken(f, 0, None, f"cannot read: {exc.strerror or exc}") from None
        with fh:
            pending: bytes | None = None
            lineno = 0
            for raw in fh:
                if pending is not None:  # a line without newline that is not the last
                    raise _Broken(f, lineno, None, "incomplete line in the middle of the log")
                lineno += 1
                if raw.endswith(b"\n"):
                    self.record(f, lineno, raw[:-1])
                else:
                    pending = raw
        if pending is not None:
            self._torn_end(f, lineno, pending, last_file)

    def _torn_end(self, f: Path, lineno: int, torn: bytes, last_file: bool) -> None:
        """A file's final line without newline: in the current file a crash mid-write (a
        warning: the daemon repairs it); in a rotated file, a broken chain."""
        if not last_file:
            raise _Broken(f, lineno, None, "incomplete last line in a rotated file")
        self.report.warnings.append(
            f"{f}:{lineno}: incomplete final line ({len(torn)} bytes, a crash "
            "mid-write; that record was never acknowledged). It is removed, and the "
            "removal recorded, the next time the daemon opens the log.")

    def record(self, f: Path, lineno: int, line: bytes) -> None:
        """Check one record against the chain so far; it becomes the chain's head."""
        record, seq, prev = _parsed(f, lineno, line)
        if self.prev_where is not None:
            self._follows(f, lineno, seq, prev)
        elif seq != 0 or prev != GENESIS:
            self.anchor = (seq, prev, f, lineno)  # an audit_pruned record must name it
        self._note_pruning(record, seq)
        self.prev_hash = hashlib.sha256(line).hexdigest()
        self._check_signed(f, lineno, seq)
        self.expected = seq + 1
        self.prev_where = (f, lineno)
        self.report.records += 1
        self.report.head_seq, self.report.head_hash = seq, self.prev_hash

    def _check_signed(self, f: Path, lineno: int, seq: int) -> None:
        """Fail when the record just hashed has the signed head's seq but not its hash."""
        signed = self.signed_head
        if signed is not None and seq == signed[0] and self.prev_hash != signed[1]:
            raise _Broken(f, lineno, seq, "the record is not the one the signed head names "
                          "(the log was rewritten from here on)")

    def _note_pruning(self, record: dict[str, Any], seq: int) -> None:
        """Note the first ``audit_pruned`` record that names the chain's first record (the
        anchor) as the start that retention left."""
        report, anchor = self.report, self.anchor
        if anchor is None or report.anchored_by is not None:
            return
        names = (record["event"], record.get("anchor_seq"), record.get("anchor_prev"))
        if names == ("audit_pruned", anchor[0], anchor[1]):
            report.anchor_seq, report.anchored_by = anchor[0], seq

    def _follows(self, f: Path, lineno: int, seq: int, prev: str) -> None:
        """Fail unless the record comes right after the one before it, unchanged."""
        expected = self.expected
        if seq > expected:
            raise _Broken(f, lineno, seq, f"seq jumps from {expected - 1} to {seq}: "
                          f"{seq - expected} record(s) removed before this one")
        if seq < expected:
            raise _Broken(f, lineno, seq, f"seq {seq} follows seq {expected - 1}: a record "
                          "was inserted or records were reordered")
        if prev != self.prev_hash:
            assert self.prev_where is not None
            pf, pl = self.prev_where
            raise _Broken(pf, pl, expected - 1, "the record was altered: its hash does not "
                          f"match the prev stored by the next record ({f}:{lineno}); or that "
                          "next record was forged")

    def finish(self) -> None:
        if self.anchor is not None and self.report.anchored_by is None:
            seq, _, f, lineno = self.anchor
            raise _Broken(f, lineno, seq, f"the chain does not start here (first seq is "
                          f"{seq}): earlier records were removed (the head of the log, or "
                          "older rotated files), and no audit_pruned record of the retention "
                          "names this record as the new start")


def verify(path: Path, signed_head: tuple[int, str] | None = None) -> VerifyReport:
    """Check the whole chain of ``path`` (its rotated files first). Names the first bad record.
    ``signed_head``: the seq and hash of the newest signed head (:mod:`sandboxd.receipts.heads`):
    the chain must hold that record, unchanged; a chain that ends before it was cut, and the
    report says how many records are missing."""
    path = Path(path)
    files = chain_files(path)
    report = VerifyReport(ok=True, files=files)
    chain = _Chain(report, signed_head)
    try:
        if not files:
            raise _Broken(path, 0, None, "no such audit log")
        for index, f in enumerate(files):
            chain.file(f, last_file=index == len(files) - 1)
        chain.finish()
    except _Broken as broken:
        report.ok, report.first_bad = False, broken.bad
        return report
    if signed_head is not None:
        return _against_head(report, signed_head[0])
    return report


def _against_head(report: VerifyReport, signed_seq: int) -> VerifyReport:
    """Fail ``report`` when its chain ends before the signed head at ``signed_seq``."""
    last = report.head_seq if report.head_seq is not None else -1
    if last >= signed_seq:
        report.signed_seq = signed_seq
        return report
    report.ok = False
    report.missing = signed_seq - last
    where = report.files[-1] if report.files else Path("?")
    report.first_bad = BadRecord(
        where, 0, last if last >= 0 else None,
        f"the log was cut: it ends at seq {last}, but a signed head names seq {signed_seq}: "
        f"{report.missing} record(s) missing after seq {last} (up to the last signed head; "
        "any written after it are gone too)")
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


def _chain_inodes(path: Path) -> list[tuple[Path, int]]:
    """The chain's files with their inodes, oldest first, as one consistent picture: listed
    until two listings in a row agree (a rotation renames every file of the chain)."""
    def listing() -> list[tuple[Path, int]]:
        files = []
        for f in chain_files(path):
            with contextlib.suppress(FileNotFoundError):
                files.append((f, os.stat(f).st_ino))
        return files

    last = listing()
    while True:
        now = listing()
        if now == last:
            return now
        last = now


def _open_successor(path: Path, inode: int) -> Any:
    """The file written after the one with ``inode``, opened and proven by its inode (the
    names shift on every rotation); the current file when ``inode`` left the chain."""
    while True:
        chain = _chain_inodes(path)
        after = next((nxt for (_, ino), nxt in itertools.pairwise(chain) if ino == inode),
                     None)
        if after is None:  # ours was pruned (nothing between it and now is left), or is current
            return path.open("rb")
        successor, expected = after
        with contextlib.suppress(FileNotFoundError):
            fh = successor.open("rb")
            if os.fstat(fh.fileno()).st_ino == expected:
                return fh
            fh.close()  # rotated again between the listing and the open: look again


def _inode(path: Path) -> int | None:
    """The inode ``path`` names now (None: no file there)."""
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _follow(path: Path, interval_s: float, fh: Any, inode: int | None
            ) -> Iterator[dict[str, Any]]:
    """Tail the file held open; when ``path`` is another file, finish ours and step to the
    file written after it (one rotation per step, each file proven by its inode)."""
    buf = b""

    def parse(data: bytes) -> Iterator[dict[str, Any]]:
        for raw in data.split(b"\n"):
            if raw.strip():
                with contextlib.suppress(ValueError):
                    yield json.loads(raw)

    while True:
        ino = _inode(path)
        if ino not in (None, inode):
            if fh is None or inode is None:
                fh = path.open("rb")  # created after we started: read it from the start
            else:
                yield from parse(buf + fh.read())  # a rotated file is complete
                fh.close()
                fh = _open_successor(path, inode)
            inode, buf = os.fstat(fh.fileno()).st_ino, b""
        if fh is not None:
            chunk = fh.read()
            if chunk:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                yield from parse(b"\n".join(lines))
                continue
        time.sleep(interval_s)
