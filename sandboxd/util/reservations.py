"""Caps reserved before any await: the one idiom for every count a burst could overshoot
(sessions per client, ``max_kernels``, MCP sessions).

A cap is checked and its unit taken in one synchronous call, :meth:`Ledger.reserve`, on the
event loop: no ``await`` between the count and the take, so of N requests that arrive together
exactly the cap's worth pass. The unit is then held across every ``await`` of the work it
admits (a workspace being made, a kernel starting, an MCP session being opened) and given back
by :meth:`Reservation.release` (idempotent) when the work failed, or once what it counted is
counted elsewhere (a registered session, a live kernel, an open MCP session). Counting only
what exists *after* an await is the bug this prevents: every request of a burst passes the
check before the first one is counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Cap:
    """One limit a reservation must stay under: ``count`` (what is taken now, this ledger's
    reservations included) must be below ``limit``; ``name`` names the setting."""

    name: str
    count: int
    limit: int


class CapReached(Exception):
    """A reservation past a cap: nothing was taken. ``cap`` is the limit it hit."""

    def __init__(self, cap: Cap) -> None:
        super().__init__(f"{cap.name}: {cap.count} of {cap.limit} taken")
        self.cap = cap


class Reservation(Generic[K]):
    """One unit a :class:`Ledger` holds for ``key``; :meth:`release` gives it back (once)."""

    __slots__ = ("_ledger", "key")

    def __init__(self, ledger: Ledger[K], key: K) -> None:
        self._ledger: Ledger[K] | None = ledger
        self.key = key

    @property
    def held(self) -> bool:
        return self._ledger is not None

    def release(self) -> None:
        """Give the unit back (idempotent)."""
        ledger, self._ledger = self._ledger, None
        if ledger is not None:
            ledger._give_back(self.key)


class Ledger(Generic[K]):
    """The units reserved now, by key."""

    def __init__(self) -> None:
        self._held: Counter[K] = Counter()
        self._total = 0

    def held(self, key: K) -> int:
        """Units reserved for ``key`` now."""
        return self._held.get(key, 0)

    @property
    def total(self) -> int:
        """Units reserved now, every key together."""
        return self._total

    def keys(self) -> set[K]:
        """Keys with a unit reserved now."""
        return set(self._held)

    def reserve(self, key: K, *caps: Cap) -> Reservation[K]:
        """Take one unit for ``key`` if every cap has room (:class:`CapReached` for the
        first that has none). Synchronous on purpose: the caller computes each cap's count
        and calls this with no await in between."""
        for cap in caps:
            if cap.count >= cap.limit:
                raise CapReached(cap)
        self._held[key] += 1
        self._total += 1
        return Reservation(self, key)

    def _give_back(self, key: K) -> None:
        self._held[key] -= 1
        if self._held[key] <= 0:
            del self._held[key]
        self._total -= 1
