"""Command plans, executed in the worker: never through a shell.

A command tool's request carries a plan (sandboxd.models.Plan), built by the daemon's policy
engine from the parsed command line and checked program by program. It is executed here as
it is, by the functions below: no shell ever sees the command line, so nothing runs that the
policy did not check. Pipelines run left to right; ``run_if`` skips one unless the status of
the last one that ran says so (``&&``: 0, ``||``: not 0); a pipeline's status is its last
command's (128 + signal when killed). Redirects are applied in order; files are opened inside
the workspace without following symlinks. Failures are reported the way /bin/sh (dash) does:
127 for a program that is not found, 126 when it cannot be executed, 2 for a redirect.
"""

from __future__ import annotations

import fcntl
import os
from typing import Any, NoReturn

from sandboxd.protocol import rules

from .landlock import restrict_exec

_OPEN_FLAGS = {"read": os.O_RDONLY, "write": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
               "append": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
               "readwrite": os.O_RDWR | os.O_CREAT}


def simple_command(plan: dict[str, Any], env: dict[str, str]) -> list[str] | None:
    """The argv of a plan that is one command without redirects or exec restriction (its
    environment is added to ``env``), else None."""
    pipelines = plan.get("pipelines") or []
    if len(pipelines) != 1 or len(pipelines[0].get("commands") or []) != 1:
        return None
    cmd = pipelines[0]["commands"][0]
    if cmd.get("redirects") or cmd.get("exec_only") is not None:
        return None
    env.update({str(k): str(v) for k, v in (cmd.get("env") or {}).items()})
    return [str(a) for a in cmd.get("argv") or []] or None


def run_plan(plan: dict[str, Any], env: dict[str, str]) -> int:
    """Execute every pipeline of ``plan`` (in the worker); returns the exit status."""
    status = 0
    for pipeline in plan.get("pipelines") or []:
        run_if = pipeline.get("run_if", "always")
        if (run_if == "ok" and status != 0) or (run_if == "failed" and status == 0):
            continue
        status = _run_pipeline(pipeline.get("commands") or [], env)
    return status


def _run_pipeline(commands: list[dict[str, Any]], env: dict[str, str]) -> int:
    pids: list[int] = []
    stdin: int | None = None
    for i, cmd in enumerate(commands):
        last = i == len(commands) - 1
        r: int | None
        w: int | None
        r, w = (None, None) if last else os.pipe()
        try:
            pids.append(_start_command(cmd, env, stdin, w, r))
        finally:
            for fd in (stdin, w):
                if fd is not None:
                    os.close(fd)
        stdin = r
    status = 0
    for pid in pids:
        _, wstatus = os.waitpid(pid, 0)
        status = (os.WEXITSTATUS(wstatus) if os.WIFEXITED(wstatus)
                  else 128 + os.WTERMSIG(wstatus))
    return status


def _start_command(cmd: dict[str, Any], env: dict[str, str], stdin: int | None,
                   stdout: int | None, other_end: int | None) -> int:
    """Fork and exec one planned command; returns its pid."""
    pid = os.fork()
    if pid:
        return pid
    try:
        _command_child(cmd, env, stdin, stdout, other_end)
    except BaseException as exc:  # never return into the worker's loop
        try:
            os.write(2, f"sandboxd runner: {exc!r}\n".encode(errors="backslashreplace"))
        finally:
            os._exit(126)


def _command_child(cmd: dict[str, Any], env: dict[str, str], stdin: int | None,
                   stdout: int | None, other_end: int | None) -> NoReturn:
    """In the command's fork: its stdin/stdout, redirects, environment and exec restriction,
    then exec; never returns."""
    if stdin is not None:
        os.dup2(stdin, 0)
    if stdout is not None:
        os.dup2(stdout, 1)
    for fd in (stdin, stdout, other_end):
        if fd is not None and fd > 2:
            os.close(fd)
    # the worker's stderr, for our own messages; above the descriptors a plan can name
    err = fcntl.fcntl(2, fcntl.F_DUPFD_CLOEXEC, 10)
    argv = [str(a) for a in cmd.get("argv") or []]
    if not argv:
        os._exit(0)
    for redirect in cmd.get("redirects") or []:
        problem = _redirect(redirect)
        if problem:
            os.write(err, f"sandboxd: {problem}\n".encode(errors="backslashreplace"))
            os._exit(2)
    child_env = dict(env)
    child_env.update({str(k): str(v) for k, v in (cmd.get("env") or {}).items()})
    exec_only = cmd.get("exec_only")
    if exec_only is not None:
        problem = restrict_exec(exec_only, child_env.get("PATH", "/usr/bin:/bin"))
        if problem:
            os.write(err, f"sandboxd: {argv[0]}: not started: {problem}\n".encode())
            os._exit(126)
    _exec(argv, child_env, err)


def _exec(argv: list[str], env: dict[str, str], err: int) -> NoReturn:
    """exec ``argv``; a failure is reported on ``err`` as /bin/sh words it (127, 126)."""
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        os.write(err, f"{argv[0]}: command not found\n".encode(errors="backslashreplace"))
        os._exit(127)
    except PermissionError:
        os.write(err, f"{argv[0]}: permission denied\n".encode(errors="backslashreplace"))
        os._exit(126)
    except OSError as exc:
        os.write(err, f"{argv[0]}: {exc.strerror}\n".encode(errors="backslashreplace"))
        os._exit(126)

def _redirect(redirect: dict[str, Any]) -> str | None:
    """Perform one redirect in the child; returns a message when it failed."""
    fd = int(redirect["fd"])
    mode = redirect["mode"]
    if mode == "close":
        try:
            os.close(fd)
        except OSError:
            pass
        return None
    if mode == "dup":
        source = int(redirect["dup"])
        try:
            if source == fd:
                os.fstat(fd)  # `n>&n`: only needs to be open
            os.dup2(source, fd)
        except OSError:
            return f"{source}: Bad file descriptor"
        return None
    path = str(redirect["path"])
    try:
        opened = _open_in_workspace(path, _OPEN_FLAGS[mode])
    except OSError as exc:
        why = ("it is or passes through a symbolic link, which is not followed"
               if exc.errno in (40, 20) else exc.strerror)  # ELOOP, ENOTDIR
        return f"cannot open {path}: {why}"
    if opened != fd:
        os.dup2(opened, fd)
        os.close(opened)
    else:
        os.set_inheritable(fd, True)
    return None


def _open_in_workspace(path: str, flags: int) -> int:
    """Open a workspace-relative path (or /dev/null) from the current directory, one component
    at a time, never following a symlink."""
    if path == "/dev/null":
        return os.open(path, flags & ~os.O_CREAT & ~os.O_TRUNC)
    try:  # the daemon sends normalised paths; the same rule holds here (sandboxd/protocol/rules.py)
        norm = rules.normalise_path(path)
    except rules.PathRefused:
        raise OSError(22, "not a workspace path") from None
    parts = rules.path_components(norm)
    if not parts:
        raise OSError(21, "the workspace itself is not a file")
    dfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=dfd)
            os.close(dfd)
            dfd = nxt
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NOCTTY, 0o666, dir_fd=dfd)
    finally:
        os.close(dfd)
