"""Durations and sizes as admins write them in policy files (``60s``, ``500ms``, ``256Mi``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from sandboxd.protocol.limits import LIMITS

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
#: the units :func:`format_size` writes, with their factors, binary first
_SIZE_UNITS = tuple((unit, base**power)
                    for units, base in ((("Ki", "Mi", "Gi", "Ti"), 1024),
                                        (("KB", "MB", "GB", "TB"), 1000))
                    for power, unit in enumerate(units, start=1))


def _with_unit(value: Any, pattern: re.Pattern[str],
               factors: Mapping[str | None, float]) -> float | None:
    """A string such as ``60s`` or ``256Mi``: its number times its unit's factor (None when
    ``value`` is not such a string)."""
    match = pattern.match(value) if isinstance(value, str) else None
    return None if match is None else float(match.group(1)) * factors[match.group(2)]


def parse_duration(value: Any) -> float:
    """Seconds from ``90``, ``1.5``, ``"500ms"``, ``"60s"``, ``"5m"`` or ``"1h"``; must be > 0."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 60s, 500ms or 5m")
    seconds = (float(value) if isinstance(value, int | float)
               else _with_unit(value, _DURATION, _DURATION_FACTOR))
    if seconds is None:
        raise ValueError(f"expected a duration such as 60s, 500ms or 5m, got {value!r}")
    if not seconds > 0:
        raise ValueError("a duration must be greater than zero")
    return seconds


def parse_size(value: Any) -> int:
    """Bytes from ``1048576``, ``"256Mi"``, ``"1G"``, ``"64KiB"``; must be > 0."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 256Mi, 1Gi or 4096")
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    number = value if whole else _with_unit(value, _SIZE, _SIZE_FACTOR)
    if number is None:
        raise ValueError(f"expected a size such as 256Mi, 1Gi or 4096, got {value!r}")
    size = int(number)
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
    exact = [(size // factor, unit) for unit, factor in _SIZE_UNITS
             if size >= factor and size % factor == 0]
    number, unit = min([(size, ""), *exact], key=lambda choice: choice[0])  # the first least
    return f"{number}{unit}"


def _plain(value: Any) -> str:
    """A number with no unit: ``1.5``, ``64``."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _bytes(value: Any) -> str:
    """A size limit's value (a whole float too) as :func:`format_size` writes it."""
    return format_size(int(value))


#: how each unit of :data:`LIMITS` is written (a count or CPUs: :func:`_plain`)
_LIMIT_FORMATS: dict[str, Callable[[Any], str]] = {"seconds": format_duration, "bytes": _bytes}


def format_limit(name: str, value: Any) -> str:
    """The limit ``name``'s ``value`` as a policy file writes it, by the limit's unit."""
    return _LIMIT_FORMATS.get(LIMITS[name].unit, _plain)(value)
