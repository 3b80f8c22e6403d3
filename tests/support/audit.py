"""Read a live audit log from a test: the one reader every test uses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def complete_lines(path: Path) -> list[bytes]:
    """The lines of ``path`` that end in a newline; none if it does not exist.

    The daemon appends each record with a single ``write(2)``, but a reader racing that write
    may see only a prefix of it. Bytes after the last newline are an append in progress (or a
    torn write the daemon will remove), never a record, so they are left out.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return data[: data.rfind(b"\n") + 1].splitlines()


def audit_records(path: Path, event: str | None = None) -> list[dict[str, Any]]:
    """The complete records of a live audit log, optionally only those of one ``event``.

    Every complete line must be a JSON record: a line that is not fails the test.
    """
    records = [json.loads(line) for line in complete_lines(path) if line.strip()]
    return [r for r in records if event is None or r.get("event") == event]
