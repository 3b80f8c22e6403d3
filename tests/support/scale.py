"""How many rounds a load or leak test runs.

The full count everywhere but under software emulation: the modern-host VM job
(tests/vm/guest/test-suite.sh) sets ``SANDBOXD_TEST_SCALE`` (e.g. ``0.2``), where creating a
container costs seconds, so that the directory fits CI's budget. The same tests run at the
full count in ``make test`` on every CI run; a scaled run still exercises every path (the
floor keeps enough rounds for concurrency and every phase of a call)."""

from __future__ import annotations

import os


def scaled(count: int, floor: int = 20) -> int:
    """``count`` times ``SANDBOXD_TEST_SCALE`` (default 1), at least ``floor``."""
    try:
        factor = float(os.environ.get("SANDBOXD_TEST_SCALE", "1"))
    except ValueError:
        factor = 1.0
    factor = min(max(factor, 0.0), 1.0)
    return max(min(count, floor), round(count * factor))
