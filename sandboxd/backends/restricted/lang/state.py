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
    #: user code runs now (a kernel's interrupt raises KeyboardInterrupt only then)
    running: bool = False
    #: a frame is being written (an interrupt waits until it is whole)
    emitting: bool = False
    #: an interrupt came while a frame was being written
    interrupt_pending: bool = False


def interrupt_user_code(*_: Any) -> None:
    """SIGINT in a session kernel (interrupt before kill, so the session keeps its state): a
    ``KeyboardInterrupt`` in the user's code while it runs - deferred while a frame is being
    written, so that the result channel never carries half a frame (:func:`after_emit` raises it
    then) - and nothing once the code has ended (the call is over: the interrupt came too late)."""
    if STATE.running and not STATE.emitting:
        raise KeyboardInterrupt
    STATE.interrupt_pending = STATE.running


def after_emit() -> None:
    """Raise the interrupt that came while a frame was being written (see above)."""
    if STATE.interrupt_pending and STATE.running and not STATE.emitting:
        STATE.interrupt_pending = False
        raise KeyboardInterrupt


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
