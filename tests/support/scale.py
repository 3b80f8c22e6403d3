"""How many rounds a load or leak test runs.

The full count everywhere but under software emulation: the modern-host VM job
(tests/vm/guest/test-suite.sh) sets ``SANDBOXD_TEST_SCALE`` (e.g. ``0.2``), where creating a
container costs seconds, so that the directory fits CI's budget. The same tests run at the
full count in ``make test`` on every CI run; a scaled run still exercises every path (the
floor keeps enough rounds for concurrency and every phase of a call)."""

from __future__ import annotations

import os


def _factor() -> float:
    try:
        factor = float(os.environ.get("SANDBOXD_TEST_SCALE", "1"))
    except ValueError:
        factor = 1.0
    return min(max(factor, 0.0), 1.0)


def scaled(count: int, floor: int = 20) -> int:
    """``count`` times ``SANDBOXD_TEST_SCALE`` (default 1), at least ``floor``."""
    return max(min(count, floor), round(count * _factor()))


def rounds(full: int, emulated: int) -> int:
    """``full`` rounds at full scale (make test), ``emulated`` (at most ``full``) in a scaled
    run: for a test whose rounds each cost seconds under emulation, where a share of ``full``
    would still not fit its time limit on a loaded host."""
    return full if _factor() >= 1.0 else min(full, emulated)


def time_bound(strict_s: float, emulated_s: float) -> float:
    """A bound on how long something took: ``strict_s`` at full scale (make test, where the
    bound is the property), ``emulated_s`` under software emulation (a scaled run), where a
    loaded host's emulation is slower by a factor no bound can know and only a hang must
    fail (CI's VM, 2026-11-28: 42 % of the host's CPU time stolen by its hypervisor)."""
    return strict_s if _factor() >= 1.0 else max(strict_s, emulated_s)
