"""Bounded decoding of what crosses the wire: each check takes a JSON value and the name to
blame, and returns it typed or raises ``ValueError`` saying what was expected (never a value
too long, too many entries, an unknown key, a bool for a number). Every codec of the protocol
decodes with these. Standard library only: the container image carries this package."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

MAX_TEXT = 1024 * 1024  # characters of one string (a word, a path, a value)

_T = TypeVar("_T")


def check_obj(data: Any, what: str, keys: Sequence[str],
              required: Sequence[str]) -> dict[str, Any]:
    """An object with no key but ``keys`` and every one of ``required``."""
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be an object")
    unknown = set(data) - set(keys)
    if unknown:
        raise ValueError(f"{what}: unknown keys {sorted(map(str, unknown))}")
    missing = [k for k in required if k not in data]
    if missing:
        raise ValueError(f"{what}: missing {missing}")
    return data


def check_text(value: Any, what: str) -> str:
    """A string of at most :data:`MAX_TEXT` characters."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string")
    if len(value) > MAX_TEXT:
        raise ValueError(f"{what} is longer than {MAX_TEXT} characters")
    return value


def check_opt_text(value: Any, what: str) -> str | None:
    """:func:`check_text`, or None."""
    return None if value is None else check_text(value, what)


def check_int(value: Any, what: str, low: int, high: int) -> int:
    """A whole number (not a bool) from ``low`` to ``high``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} must be a whole number from {low} to {high}")
    return value


def check_list(value: Any, what: str, most: int, item: Callable[[Any, str], _T],
               least: int = 0) -> tuple[_T, ...]:
    """A list of ``least`` to ``most`` entries, each decoded by ``item``."""
    if not isinstance(value, list):
        raise ValueError(f"{what} must be a list")
    if not least <= len(value) <= most:
        raise ValueError(f"{what} must have {least} to {most} entries")
    return tuple(item(v, f"{what}[{i}]") for i, v in enumerate(value))


def check_choice(value: Any, what: str, allowed: tuple[str, ...]) -> str:
    """One of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{what} must be one of {list(allowed)}")
    return cast(str, value)
