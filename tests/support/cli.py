"""``sandboxd ...`` as an admin runs it, for tests: the one way a test runs a CLI command to
its end (issue 23, item 7).

:func:`run` is ``subprocess.run([python, "-m", "sandboxd", *args], capture_output=True,
text=True)``: a process of its own, with the environment, working directory and standard
input given, whose exit status, stdout and stderr are returned. It is forked from a server
(:mod:`tests.support.cli_server`, one per pytest worker) that imported the CLI once: a fresh
interpreter spends ~0.2 s of CPU on its imports, and the suite runs some two hundred commands
on two cores. What a command imports is asked of a fresh interpreter
(:mod:`tests.support.imports`); a command a test talks to while it runs (``chat``,
``audit tail -f``, ``serve``) is a :class:`subprocess.Popen` of its own.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parent.parent.parent

_lock = threading.Lock()
_server: tuple[subprocess.Popen[bytes], str] | None = None


def _socket_path() -> str:
    """The server's socket; started on first use, stopped at exit."""
    global _server
    with _lock:
        if _server is not None and _server[0].poll() is None:
            return _server[1]
        where = tempfile.mkdtemp(prefix="sandboxd-cli-")
        path = os.path.join(where, "s")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
        proc = subprocess.Popen([sys.executable, "-m", "tests.support.cli_server", path],
                                cwd=REPO, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # ends when it is ready, or when it failed
        if line != b"ready\n":
            proc.kill()
            raise RuntimeError(f"the CLI fork server did not start (exit {proc.wait()})")
        _server = (proc, path)
        atexit.register(_stop, proc, where)
        return path


def _stop(proc: subprocess.Popen[bytes], where: str) -> None:
    if proc.stdin is not None:
        proc.stdin.close()  # its end of input: it returns
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(where, "s"))
        os.rmdir(where)


def _readline(conn: socket.socket, buf: bytearray) -> dict[str, int]:
    while b"\n" not in buf:
        chunk = conn.recv(4096)
        if not chunk:
            raise RuntimeError("the CLI fork server's waiter ended without an answer")
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return dict(json.loads(line))


def _text(data: bytes) -> str:
    """As ``subprocess.run(text=True)`` decodes (UTF-8 here, universal newlines)."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8").read()


def run(*args: str, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
        input: str | None = None,
        timeout: float = 60, module: str = "sandboxd") -> subprocess.CompletedProcess[str]:
    """``python -m sandboxd *args`` to its end (``env``: the whole environment, this
    process's when None; ``input``: its stdin, else ``/dev/null``). A command still running
    after ``timeout`` seconds is killed and :class:`subprocess.TimeoutExpired` raised.
    ``module``: another module to run as ``__main__`` (the runner's own tests)."""
    cmd = [sys.executable, "-m", module, *args]
    request = {"module": module, "argv": list(args),
               "env": dict(os.environ if env is None else env),
               "cwd": str(cwd if cwd is not None else os.getcwd())}
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as out, \
            tempfile.TemporaryFile() as err, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        if input is not None:
            stdin.write(input.encode())
            stdin.seek(0)
        with open(os.devnull, "rb") as null:
            source: IO[bytes] = stdin if input is not None else null
            conn.connect(_socket_path())
            fds = array.array("i", [source.fileno(), out.fileno(), err.fileno()])
            conn.sendmsg([json.dumps(request).encode()],
                         [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
        buf = bytearray()
        conn.settimeout(timeout)
        pid = _readline(conn, buf)["pid"]
        try:
            status = _readline(conn, buf)["status"]
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            conn.settimeout(None)
            _readline(conn, buf)  # reaped: nothing of it is left
            raise subprocess.TimeoutExpired(cmd, timeout) from None
        out.seek(0)
        err.seek(0)
        stdout, stderr = _text(out.read()), _text(err.read())
    return subprocess.CompletedProcess(cmd, os.waitstatus_to_exitcode(status), stdout, stderr)
