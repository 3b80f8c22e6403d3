"""A daemon's stop, for the calls in flight: each call is tracked from its admission on
(before its first ``await``); the drain lets them finish for a grace, then cancels the rest,
each of which answers :class:`~sandboxd.errors.DrainCancelled` (or :class:`Draining`, when
its backend had not run yet) rather than a cut connection."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sandboxd.errors import Draining
from sandboxd.health.state import Health
from sandboxd.util.stopclock import StopClock


class Drain:
    """The calls in flight and the drain's cancel of those still running after the grace;
    ``health.draining`` says the daemon takes no new call, within the ``stop_clock``'s
    bound."""

    def __init__(self, health: Health, stop_clock: StopClock) -> None:
        self.health = health
        self.stop_clock = stop_clock
        self._inflight: set[asyncio.Task[Any]] = set()
        self._cancelled: set[asyncio.Task[Any]] = set()  # answered as DrainCancelled

    def begin(self) -> None:
        """From now on refuse new calls (503) and report not ready; in-flight calls go on."""
        self.health.draining = True

    async def drain(self, grace_s: float) -> None:
        """Refuse new calls; let in-flight calls finish for ``grace_s``, then cancel them
        within the calls' half of the stop's bound."""
        self.begin()
        pending = set(self._inflight)
        if pending:
            _done, still = await asyncio.wait(pending, timeout=grace_s)
            self.stop_clock.start()
            for task in still:
                self._cancelled.add(task)
                task.cancel()
            if still:
                await asyncio.wait(still, timeout=self.stop_clock.calls_left())
        self.stop_clock.start()

    def cancelled(self, task: asyncio.Task[Any] | None) -> bool:
        """Whether the drain cancelled ``task`` (its caller gets an answer, not a cut)."""
        return task is not None and task in self._cancelled

    @contextmanager
    def tracked(self, task: asyncio.Task[Any] | None) -> Iterator[None]:
        """The call ``task`` runs in flight; the drain's cancel of it before its backend ran
        (nothing turned it into a result) becomes :class:`Draining`."""
        if task is not None:
            self._inflight.add(task)
        try:
            yield
        except asyncio.CancelledError:
            if task is None or task not in self._cancelled:
                raise
            task.uncancel()  # cancelled by the drain before its backend ran: refused
            raise Draining("the daemon is shutting down and cancelled this call before it "
                           "ran; retry on another instance or later") from None
        finally:
            if task is not None:
                self._inflight.discard(task)
                self._cancelled.discard(task)
