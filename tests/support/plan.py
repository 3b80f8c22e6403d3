"""Execute a command plan with the container runner's own executor, on the host (for tests).

The runner is the package ``images/runner/sandboxd_runner/``; its plan executor (``run_plan``)
is imported from there - with ``sandboxd.protocol``, the same package the image carries -, so
the tests exercise exactly the code that runs in the sandbox. A plan runs in a forked child
set up the way the runner sets up its worker: stdin ``/dev/null``, stdout and stderr
captured, descriptors above 2 closed, default signals.
"""

from __future__ import annotations

import functools
import importlib
import os
import signal
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from types import ModuleType

from sandboxd.cli.images import images_dir
from sandboxd.models import Invocation
from sandboxd.protocol.limits import Limits
from sandboxd.protocol.plan import Plan


@functools.cache
def runner_module(name: str) -> ModuleType:
    """``sandboxd_runner.<name>``, imported from ``images/runner/`` (put on ``sys.path`` for
    the import only)."""
    where = str(images_dir() / "runner")
    sys.path.insert(0, where)
    try:
        return importlib.import_module(f"sandboxd_runner.{name}")
    finally:
        sys.path.remove(where)


def execute(plan: Plan, cwd: Path, env: dict[str, str],
            timeout_s: float = 20.0) -> tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr) of ``plan`` run by the runner's executor in ``cwd``."""
    run_plan = runner_module("plans").run_plan
    data = plan.to_wire()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.chdir(cwd)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                os.closerange(3, 65536)
                for sig in (signal.SIGPIPE, signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, signal.SIG_DFL)
                signal.alarm(int(timeout_s))
                os._exit(run_plan(data, dict(env)) & 0xFF)
            except BaseException:
                os._exit(255)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
        return code, out.read(), err.read()


def with_limits(inv: Invocation, limits: Limits) -> Invocation:
    """``inv`` whose plan has these limits (a backend runs a call under its plan's limits)."""
    return inv.model_copy(update={"plan": replace(inv.plan, limits=limits)})
