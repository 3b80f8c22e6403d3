"""Durations and sizes as admins write them in policy files (``60s``, ``500ms``, ``256Mi``)."""

from __future__ import annotations

import re
from typing import Any

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_FACTOR = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|[kKMGT]B|B)?\s*$")
_SIZE_FACTOR = {
    None: 1, "B": 1,
    "K": 1000, "k": 1000, "KB": 1000, "kB": 1000,
    "M": 1000**2, "MB": 1000**2, "G": 1000**3, "GB": 1000**3, "T": 1000**4, "TB": 1000**4,
    "Ki": 1024, "KiB": 1024, "Mi": 1024**2, "MiB": 1024**2,
    "Gi": 1024**3, "GiB": 1024**3, "Ti": 1024**4, "TiB": 1024**4,
}


def parse_duration(value: Any) -> float:
    """Seconds from ``90``, ``1.5``, ``"500ms"``, ``"60s"``, ``"5m"`` or ``"1h"``; must be > 0."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 60s, 500ms or 5m")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _DURATION_FACTOR[m.group(2)]
    else:
        raise ValueError(f"expected a duration such as 60s, 500ms or 5m, got {value!r}")
    if not seconds > 0:
        raise ValueError("a duration must be greater than zero")
    return seconds


def parse_size(value: Any) -> int:
    """Bytes from ``1048576``, ``"256Mi"``, ``"1G"``, ``"64KiB"``; must be > 0."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 256Mi, 1Gi or 4096")
    if isinstance(value, int):
        size = value
    elif isinstance(value, float) and value.is_integer():
        size = int(value)
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        size = int(float(m.group(1)) * _SIZE_FACTOR[m.group(2)])
    else:
        raise ValueError(f"expected a size such as 256Mi, 1Gi or 4096, got {value!r}")
    if size <= 0:
        raise ValueError("a size must be greater than zero")
    return size


def format_duration(seconds: float) -> str:
    """``60s``, ``1.5s``, ``500ms``."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"


def format_size(size: int) -> str:
    """A size the way an admin writes it: the exact unit with the smallest number, binary
    first on a tie (``256Mi``, ``256MB``, ``1Gi``, ``1500``); parses back to ``size``."""
    best = str(size)
    best_number = size
    for units, base in ((("Ki", "Mi", "Gi", "Ti"), 1024), (("KB", "MB", "GB", "TB"), 1000)):
        for power, unit in enumerate(units, start=1):
            factor = base**power
            if size >= factor and size % factor == 0 and size // factor < best_number:
                best, best_number = f"{size // factor}{unit}", size // factor
    return best
