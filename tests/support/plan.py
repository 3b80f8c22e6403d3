"""Execute a command plan with the container runner's own executor, on the host (for tests).

The runner (``images/runner/sandboxd-runner.py``) is a standalone script; its plan executor
(``run_plan``) is loaded from it as a module - from a copy laid out as in the image, next to
the ``protocol/`` package -, so the tests exercise exactly the code that runs in the
sandbox. A plan runs in a forked child set up the way the runner sets up its worker: stdin
``/dev/null``, stdout and stderr captured, descriptors above 2 closed, default signals.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import signal
import tempfile
from pathlib import Path
from types import ModuleType

from sandboxd.cli.images import images_dir, shared_modules
from sandboxd.protocol.plan import Plan


@functools.cache
def runner() -> ModuleType:
    where = Path(tempfile.mkdtemp(prefix="sandboxd-runner-"))
    path = where / "sandboxd-runner.py"
    shutil.copy2(images_dir() / "runner" / "sandboxd-runner.py", path)
    for name, source in shared_modules().items():
        (where / name).parent.mkdir(exist_ok=True)
        shutil.copy2(source, where / name)
    spec = importlib.util.spec_from_file_location("sandboxd_runner_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def execute(plan: Plan, cwd: Path, env: dict[str, str],
            timeout_s: float = 20.0) -> tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr) of ``plan`` run by the runner's executor in ``cwd``."""
    run_plan = runner().run_plan
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
