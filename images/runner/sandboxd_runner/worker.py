"""A call's worker process: a fork of the runner set up for the call (its own session and
process group, oom_score_adj 1000, stdin /dev/null or the pipe a plan asked for, the
request's environment and nothing else, dumpable only once the channel's fd is closed) that
runs python code or executes a command plan; or, for a plan that is one plain program, that
program started with posix_spawn (no fork of this interpreter: much cheaper)."""

from __future__ import annotations

import os
import signal
from typing import NoReturn

from sandboxd.protocol.call import WorkerRequest

from .base import find_program, set_dumpable, set_oom_score_adj
from .execution import run_python
from .kernel_child import reset_child
from .plans import run_plan, simple_command
from .rlimits import Rlimits, inherited_as_is


def _close_fds_except(keep: set[int]) -> None:
    """Close every fd from 3 up but those in ``keep``."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


def worker(req: WorkerRequest, out_w: int, err_w: int, value_w: int | None,
           display_w: int | None, rlimits: Rlimits = (), in_r: int | None = None) -> NoReturn:
    """In the forked worker: set up fds, session, signals, then exec (command) or run code."""
    try:
        # a command posix_spawn would have started but for the rlimits: exec'd by the worker
        # itself once they are set (the same process, argv and environment as then)
        direct = spawnable(req) if rlimits else None
        os.setsid()
        os.dup2(os.open(os.devnull, os.O_RDONLY) if in_r is None else in_r, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        _close_fds_except({fd for fd in (value_w, display_w) if fd is not None})
        # only now (the channel's fd is closed) may the user's own process be dumpable
        set_dumpable(1)
        # before user code; each command of a plan inherits them
        reset_child(req.runner.cwd, rlimits)
        env = dict(req.runner.env)
        if req.kind == "python":
            assert value_w is not None and display_w is not None  # python: both pipes exist
            run_python(req, value_w, display_w)
        if direct is not None:
            try:
                os.execve(*direct)
            except OSError:
                pass  # the plan executor tries again and reports why, in the shell's words
        os._exit(run_plan(req.plan.to_wire() if req.plan else {}, env) & 0xFF)
    except BaseException as exc:  # never return into the handler's code
        try:
            os.write(2, f"sandboxd runner: {exc!r}\n".encode())
        finally:
            os._exit(126)


def spawnable(req: WorkerRequest) -> tuple[str, list[str], dict[str, str]] | None:
    """``(path, argv, env)`` of a request that is one plain command run where this process
    runs, else None (python code, a plan with pipes, sequencing, redirects or an exec
    restriction, another cwd, or a program that cannot be found - the plan executor reports
    that with the shell's wording)."""
    if req.kind != "plan" or req.plan is None:
        return None
    if os.path.realpath(req.runner.cwd) != os.getcwd():
        return None
    env = dict(req.runner.env)
    argv = simple_command(req.plan.to_wire(), env)
    if not argv:
        return None
    path = find_program(argv[0], env.get("PATH", "/usr/bin:/bin"))
    if path is None:
        return None
    return path, argv, env


def spawn_command(req: WorkerRequest, out_w: int, err_w: int,
                  rlimits: Rlimits = (), in_r: int | None = None) -> int | None:
    """Start a plan that is one plain command with posix_spawn (no fork of this interpreter:
    much cheaper).

    Returns None when the request needs the fork path (see :func:`spawnable`; also for
    rlimits this process does not have already: posix_spawn cannot set them in the child,
    so the worker sets them and then execs the command itself, see :func:`worker`).
    """
    spawn = spawnable(req) if inherited_as_is(rlimits) else None
    if spawn is None:
        return None
    path, argv, env = spawn
    adj = set_oom_score_adj("1000")  # inherited by the child; ours is restored below
    try:
        return os.posix_spawn(
            path, argv, env,
            file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0) if in_r is None
                          else (os.POSIX_SPAWN_DUP2, in_r, 0),
                          (os.POSIX_SPAWN_DUP2, out_w, 1),
                          (os.POSIX_SPAWN_DUP2, err_w, 2)],
            setsid=True,
            setsigdef=(signal.SIGPIPE, signal.SIGCHLD, signal.SIGINT, signal.SIGTERM),
            setsigmask=(),
        )
    finally:
        if adj:
            set_oom_score_adj("0")
