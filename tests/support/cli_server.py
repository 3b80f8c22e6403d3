"""The fork server behind :mod:`tests.support.cli`: one per pytest worker, it imports the CLI
once and forks a child for every ``sandboxd ...`` a test runs.

``python -m tests.support.cli_server SOCKET``: listens on the Unix socket ``SOCKET``, prints
``ready`` and serves until its standard input ends (the test process is gone). A request is
one JSON message (``module``, ``argv``, ``env``, ``cwd``, ``ignored``: the signals the caller
ignores) with three descriptors
(``SCM_RIGHTS``): the child's stdin, stdout and stderr. For each, a waiter process forks the
child, sends its pid (``{"pid": N}``), waits for it and sends its wait status
(``{"status": N}``). The child is what ``python -m sandboxd ARGV`` would be after its imports:
its own process, descriptors 0-2, environment (as the interpreter coerces it), working
directory, temporary directory, ``sys.argv``, signal dispositions, exit status, ``atexit``
handlers and error output - only the modules are already imported (tests of what a command
imports start a fresh interpreter: :mod:`tests.support.imports`).
"""

from __future__ import annotations

import array
import atexit
import contextlib
import importlib
import io
import json
import locale
import os
import runpy
import selectors
import signal
import socket
import sys
import tempfile
import traceback
from typing import Any

#: interpreter settings a child applies from its own environment (or that are read when used,
#: not at the start); any other ``PYTHON*`` variable must be the server's
#: (:func:`tests.support.cli.forkable`)
APPLIED = frozenset({"PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONCOERCECLOCALE",
                     "PYTHONBREAKPOINT", "PYTHONASYNCIODEBUG"})

#: imported before the first fork: the CLI, what its commands import when they run, and what
#: ``sandboxd serve`` imports on its way to ready (its app, uvicorn's parts, the backends).
#: Never psutil: a test checks that a daemon has not loaded it.
PRELOAD = ("sandboxd.cli", "sandboxd.config", "sandboxd.models", "sandboxd.policy",
           "sandboxd.audit", "sandboxd.access.tokens", "sandboxd.client", "httpx", "yaml",
           "sandboxd.cli.daemon", "sandboxd.api.app", "sandboxd.api.connections",
           "sandboxd.host.heap", "sandboxd.health.notify", "sandboxd.host.uidclaim",
           "sandboxd.host.statelock",
           "sandboxd.results.outputs", "sandboxd.backends.restricted.backend",
           "sandboxd.backends.container.backend", "sandboxd.backends.workspace.backend",
           "uvicorn", "uvloop", "uvicorn.loops.uvloop", "uvicorn.lifespan.on",
           "uvicorn.protocols.http.httptools_impl")


def recv_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """A request and its three descriptors."""
    fds = array.array("i")
    data, ancdata, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return json.loads(data), list(fds)


def _stdio() -> None:
    """Fresh text streams on descriptors 0-2, as a new interpreter makes them (UTF-8)."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))

    def stream(fd: int, mode: str, errors: str, buffering: int) -> io.TextIOWrapper:
        raw = io.FileIO(fd, mode, closefd=False)
        buffered: Any = (io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw))
        return io.TextIOWrapper(buffered, encoding="utf-8", errors=errors,
                                line_buffering=buffering == 1 and os.isatty(fd),
                                write_through=unbuffered)
    sys.stdin = sys.__stdin__ = stream(0, "r", "surrogateescape", -1)
    sys.stdout = sys.__stdout__ = stream(1, "w", "surrogateescape", 1)
    sys.stderr = sys.__stderr__ = stream(2, "w", "backslashreplace", 1)


def _signals(ignored: set[int]) -> None:
    """The dispositions a new interpreter has: what its parent ignored stays ignored (an exec
    keeps it), every other signal is at its default; then the interpreter's own: SIGPIPE and
    SIGXFSZ ignored, SIGINT raising KeyboardInterrupt unless it was ignored."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if signal.SIGINT not in ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _coerced(env: dict[str, str]) -> dict[str, str]:
    """``env`` as the interpreter leaves it at its start (PEP 538): a C locale for text
    becomes ``LC_CTYPE=C.UTF-8``."""
    if env.get("LC_ALL") or env.get("PYTHONCOERCECLOCALE") == "0":
        return env
    if (env.get("LC_CTYPE") or env.get("LANG") or "C") in ("C", "POSIX"):
        return {**env, "LC_CTYPE": "C.UTF-8"}
    return env


def _exit_code(exc: SystemExit) -> int:
    """What the interpreter does with ``SystemExit``: None is 0, an int is the status, anything
    else is printed to stderr and is 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def child(request: dict[str, Any], fds: list[int]) -> None:  # pragma: no cover - forked
    """Become ``python -m MODULE ARGV``; never returns."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, 65536)
        _signals(set(request["ignored"]))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(_coerced(request["env"]))
        locale.setlocale(locale.LC_CTYPE, "")
        tempfile.tempdir = None  # found again, from this environment's TMPDIR
        sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
        _stdio()
        sys.argv = [request["module"], *request["argv"]]
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except KeyboardInterrupt:  # the interpreter's end: the traceback, then SIGINT itself
            traceback.print_exc()
            _flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
        _flush()
    finally:
        os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def waiter(conn: socket.socket, request: dict[str, Any],
           fds: list[int]) -> None:  # pragma: no cover - forked
    """Fork the child, tell its pid, wait for it and tell its wait status; never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # else the child is reaped unseen
        pid = os.fork()
        if pid == 0:
            conn.close()
            child(request, fds)
        for fd in fds:
            os.close(fd)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        conn.sendall(json.dumps({"status": status}).encode() + b"\n")
    finally:
        os._exit(0)


def serve(path: str) -> None:
    """Accept requests until standard input ends."""
    for name in PRELOAD:
        importlib.import_module(name)
    from sandboxd.cli import build

    build()  # every command module
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # waiters are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.fileobj is sys.stdin:
                if not os.read(sys.stdin.fileno(), 4096):
                    return  # the test process is gone
                continue
            conn, _ = listener.accept()
            with conn:
                request, fds = recv_request(conn)
                if os.fork() == 0:
                    listener.close()
                    waiter(conn, request, fds)
                for fd in fds:
                    os.close(fd)


if __name__ == "__main__":
    serve(sys.argv[1])
