"""Child processes of the tests start with default signal handling.

A test process may run with signals blocked or ignored by what ran in it before (event loops in
threads, libraries): a child inherits both across exec, and a CLI that is told to stop with
SIGINT then never hears it. Pass :func:`default_signals` as ``preexec_fn``."""

from __future__ import annotations

import signal


def default_signals() -> None:
    """In the child, before exec: nothing blocked, SIGINT/SIGTERM/SIGPIPE at their defaults."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
