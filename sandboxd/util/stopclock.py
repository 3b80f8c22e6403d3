"""The one bound of a stop after the drain's grace (``shutdown_timeout_s``), shared by the
service (the cancelled calls' cleanup, keeping the sessions) and the server (the answers still
going out): a stop ends within ``drain_grace_s`` plus it, whatever clients and sandboxes do."""

from __future__ import annotations

import time


class StopClock:
    """Started when the drain's grace ends; before that, all of the bound is left."""

    def __init__(self, bound_s: float) -> None:
        self.bound_s = bound_s
        self.deadline: float | None = None

    def start(self) -> None:
        """The grace is over (idempotent)."""
        if self.deadline is None:
            self.deadline = time.monotonic() + self.bound_s

    def left(self) -> float:
        """Seconds left of the bound: its second half keeps the sessions."""
        if self.deadline is None:
            return self.bound_s
        return max(self.deadline - time.monotonic(), 0.0)

    def calls_left(self) -> float:
        """What is left of its first half: the cancelled calls' cleanup and the answers still
        going out."""
        return max(self.left() - self.bound_s / 2, 0.0)
