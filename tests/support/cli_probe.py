"""``python -m tests.support.cli_probe ARGS``: prints, as JSON, what a command finds of its
process (arguments, working directory, environment, temporary directory, standard streams,
signal dispositions, open descriptors), for ``tests/unit/test_cli_runner.py`` to compare a
forked command (:mod:`tests.support.cli`) with a fresh interpreter's."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile


def describe() -> dict[str, object]:
    handlers = {int(sig): repr(signal.getsignal(sig)) for sig in signal.valid_signals()
                if sig not in (signal.SIGKILL, signal.SIGSTOP)}
    return {
        "argv": sys.argv, "main": __name__, "cwd": os.getcwd(), "env": dict(os.environ),
        "tmp": tempfile.gettempdir(), "stdin": sys.stdin.read(),
        "streams": [(s.encoding, s.errors, s.write_through)
                    for s in (sys.stdin, sys.stdout, sys.stderr)],
        "signals": handlers, "bytecode": not sys.dont_write_bytecode,
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
    }


if __name__ == "__main__":
    print(json.dumps(describe()))
    print("to stderr", file=sys.stderr)
    if os.environ.get("PROBE_EXIT") == "interrupt":
        raise KeyboardInterrupt
    sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
