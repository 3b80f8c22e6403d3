"""The audit log's signed heads, ``<audit log>.heads``: one JSON line per signed head, the
chain's last durable record (seq and SHA-256) signed with the receipt key, written by the
daemon periodically and when the log closes. :func:`last_head` gives the newest one whose
signature holds, for ``sandboxd audit verify``: a chain that ends before it was cut."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sandboxd.receipts.canonical import check_receipt
from sandboxd.receipts.keys import KeySet

HEAD_TYPE = "sandboxd-audit-head/1"


def heads_path(audit_path: Path) -> Path:
    """The heads file of an audit log (beside it; not one of its rotated files)."""
    return Path(f"{audit_path}.heads")


@dataclass(frozen=True)
class SignedHead:
    seq: int
    sha256: str
    ts: str
    line: int


#: a problem of the heads file: its line (0: the whole file) and what is wrong
Problem = tuple[int, str]


_CORRUPT = "not a signed head (edited or corrupt)"


def _head(raw: bytes, number: int, keys: KeySet | None) -> SignedHead | str:
    """Line ``number`` of the heads file as a signed head (its signature checked when
    ``keys`` are given), or why it is not one."""
    try:
        record = json.loads(raw)
    except ValueError:
        return _CORRUPT
    if not isinstance(record, dict):  # JSON, but no head (a number, a list...)
        return _CORRUPT
    why = check_receipt(record, keys, kind=HEAD_TYPE) if keys is not None else None
    if why is not None:
        return f"the signed head does not verify: {why}"
    seq, sha = record.get("seq"), record.get("sha256")
    if type(seq) is not int or not isinstance(sha, str):  # true and false are ints too
        return _CORRUPT
    return SignedHead(seq, sha, str(record.get("ts")), number)


def last_head(audit_path: Path,
              keys: KeySet | None) -> tuple[SignedHead | None, Problem | None]:
    """The newest signed head of ``audit_path`` and, when a head line does not verify (or no
    ``keys`` were given to verify with), the problem. (None, None): no heads file."""
    path = heads_path(audit_path)
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, (0, f"cannot read: {exc.strerror or exc}")
    head, problem = _newest(lines, keys)
    if problem is None and head is not None and keys is None:
        problem = (0, "no receipt keys to check the signed heads' signatures with (give "
                      "--key or --state-dir)")
    return head, problem


def _newest(lines: list[bytes],
            keys: KeySet | None) -> tuple[SignedHead | None, Problem | None]:
    """The newest signed head of the heads file's ``lines`` up to the first that is not one,
    and that line's problem."""
    head: SignedHead | None = None
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        found = _head(raw, number, keys)
        if isinstance(found, str):
            return head, (number, found)
        if head is None or found.seq >= head.seq:
            head = found
    return head, None
