"""Per-run state and the errors of the language layer (limit hits, violations)."""

from __future__ import annotations

import sys
from typing import Any

SANDBOX_FILENAME = "<code>"


class LimitExceeded(BaseException):
    """A limit of the sandbox was hit (output). Derives from BaseException and is re-raised by
    every ``except``/``finally`` of user code, so user code cannot swallow it."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class SandboxViolation(PermissionError):
    """User code tried something the language layer refuses (message for the model)."""


# tracebacks show these by their bare names, without a host module path
LimitExceeded.__module__ = SandboxViolation.__module__ = "builtins"

#: exceptions that user code may not catch (re-raised at the start of every handler)
UNCATCHABLE: tuple[type[BaseException], ...] = (LimitExceeded, MemoryError, RecursionError)


class _State:
    """Per-run mutable state (one run per forked worker)."""

    limit_hit: LimitExceeded | None = None
    memory_hit: bool = False
    value: Any = None
    has_value: bool = False


STATE = _State()


def limit_check() -> None:
    """Inserted at the top of every ``except`` handler and ``finally`` block of user code."""
    exc = sys.exc_info()[1]
    if exc is not None and isinstance(exc, UNCATCHABLE):
        if isinstance(exc, MemoryError):
            STATE.memory_hit = True
        raise exc
    if STATE.limit_hit is not None:
        raise STATE.limit_hit
