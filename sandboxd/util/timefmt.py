"""The one way sandboxd writes a time: ISO 8601 in UTC with a ``Z`` (audit, tokens, readiness)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Literal


def utc_iso(when: float | datetime | None = None, *,
            timespec: Literal["seconds", "microseconds"] = "microseconds") -> str:
    """``when`` (an epoch, an aware datetime, or now) as ``YYYY-MM-DDTHH:MM:SS[.ffffff]Z``."""
    if when is None:
        when = time.time()
    value = when if isinstance(when, datetime) else datetime.fromtimestamp(when, UTC)
    return value.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")
