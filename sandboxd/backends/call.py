"""One call as a backend's functions take it: what :meth:`Backend.run` was given and what it
derived once (the plan's limits, the moment it began), passed as one object instead of the
same five values threaded as loose parameters through every function of the backend."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sandboxd.models import Invocation
from sandboxd.protocol.limits import Limits


@dataclass(frozen=True)
class BackendCall:
    """An admitted call on its backend: the invocation, the moment by which it must have
    ended (``deadline``, ``time.monotonic()``) and the moment it began (``started``: its
    wall time runs from then)."""

    invocation: Invocation
    deadline: float
    started: float = field(default_factory=time.monotonic)

    @property
    def limits(self) -> Limits:
        """The call's effective limits: its plan's (the one definition, as the policy
        decided them)."""
        return self.invocation.plan.limits

    def left(self) -> float:
        """Seconds left before the deadline (never negative)."""
        return max(self.deadline - time.monotonic(), 0.0)
