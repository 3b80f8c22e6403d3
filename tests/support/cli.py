"""``sandboxd ...`` as an admin runs it, for tests: the one way a test runs a CLI command to
its end, and the way a test daemon is started (forked from a
server that did the imports once: CI's emulated VM job is slow).

:func:`run` is ``subprocess.run([python, "-m", "sandboxd", *args], capture_output=True,
text=True)``: a process of its own, with the environment, working directory and standard
input given, whose exit status, stdout and stderr are returned. :func:`spawn` starts one and
leaves it running (a :class:`Forked`, which a test waits for, signals and polls as a
:class:`subprocess.Popen`): ``tests.support.daemon`` starts ``sandboxd serve`` with it.
Both fork the command from a server (:mod:`tests.support.cli_server`, one per pytest worker)
that made the CLI's and the daemon's imports once: a fresh interpreter spends ~0.2 s of CPU on
an admin command's imports and ~0.5 s on a daemon's (some ten times that under the VM job's
emulation), and the suite runs some two hundred commands and a hundred daemons on two cores.

A command whose interpreter settings (``PYTHONPATH`` and the other ``PYTHON*`` variables
read at a start) are not the server's is a fresh interpreter (:func:`forkable`): the
language-bypass harness of ``tests/security`` is a ``sitecustomize`` on ``PYTHONPATH``. What
a command imports is asked of a fresh interpreter (:mod:`tests.support.imports`); a command
a test talks to on its pipes while it runs (``chat``, ``audit tail -f``) is a
:class:`subprocess.Popen` of its own. tests/unit/test_cli_runner.py compares a forked
command's process with a fresh interpreter's.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from tests.support import cli_server

REPO = Path(__file__).resolve().parent.parent.parent

_lock = threading.Lock()
_server: tuple[subprocess.Popen[bytes], str] | None = None
#: the server's interpreter settings (see :func:`forkable`)
_server_settings: dict[str, str] | None = None


def argv(module: str, args: Sequence[str]) -> list[str]:
    """``python -m module *args``: what a command is, forked or fresh."""
    return [sys.executable, "-m", module, *args]


def interpreter_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` an interpreter reads as it starts (``PYTHONPATH``, ``PYTHON-
    HASHSEED``, ...; an empty one is unset) and a forked child cannot apply itself: it has
    the server's (those it applies: :data:`tests.support.cli_server.APPLIED`)."""
    return {k: v for k, v in env.items()
            if k.startswith("PYTHON") and v and k not in cli_server.APPLIED}


def forkable(env: Mapping[str, str]) -> bool:
    """Whether a command with ``env`` can be forked from the server: its interpreter settings
    are the server's (a test's ``sitecustomize`` on ``PYTHONPATH`` runs at a start only)."""
    return interpreter_settings(env) == interpreter_settings(
        os.environ if _server_settings is None else _server_settings)


def _socket_path() -> str:
    """The server's socket; started on first use, stopped at exit."""
    global _server, _server_settings
    with _lock:
        if _server is not None and _server[0].poll() is None:
            return _server[1]
        where = tempfile.mkdtemp(prefix="sandboxd-cli-")
        path = os.path.join(where, "s")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
        _server_settings = interpreter_settings(env)
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


def _ignored_signals() -> list[int]:
    """The signals this process ignores: a child it executes ignores them too."""
    return [int(sig) for sig in signal.valid_signals()
            if sig not in (signal.SIGKILL, signal.SIGSTOP)
            and signal.getsignal(sig) is signal.SIG_IGN]


class Forked:
    """A command forked by the server, as much of :class:`subprocess.Popen` as tests use:
    ``pid``, ``args``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate``,
    ``kill``. Its end comes from its waiter (the wait status), never from a guess."""

    def __init__(self, module: str, args: Sequence[str], *, env: Mapping[str, str],
                 cwd: str | Path, stdio: tuple[int, int, int]) -> None:
        self.args = argv(module, args)
        self.returncode: int | None = None
        request = {"module": module, "argv": list(args), "env": dict(env), "cwd": str(cwd),
                   "ignored": _ignored_signals()}
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._buf = bytearray()
        try:
            self._conn.connect(_socket_path())
            self._conn.sendmsg([json.dumps(request).encode()],
                               [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                 array.array("i", stdio).tobytes())])
            self.pid = self._answer(None)["pid"]
        except BaseException:
            self._conn.close()
            raise

    def _answer(self, timeout: float | None) -> dict[str, int]:
        """The waiter's next line within ``timeout`` (``TimeoutError``)."""
        self._conn.settimeout(timeout)
        while b"\n" not in self._buf:
            chunk = self._conn.recv(4096)
            if not chunk:
                raise RuntimeError("the CLI fork server's waiter ended without an answer")
            self._buf += chunk
        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf[:] = rest
        return dict(json.loads(line))

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                status = self._answer(timeout)["status"]
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
            self.returncode = os.waitstatus_to_exitcode(status)
            self._conn.close()
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            return self.wait()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not yet reaped: the pid is still this command's
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(module: str, args: Sequence[str], *, env: Mapping[str, str],
          cwd: str | Path | None = None, stdout: int) -> Forked | subprocess.Popen[bytes]:
    """``python -m module *args`` started and left running (stdin ``/dev/null``, stdout and
    stderr to ``stdout``), e.g. a test daemon (:mod:`tests.support.daemon`); a fresh
    interpreter when its interpreter settings are not the server's (:func:`forkable`)."""
    if not forkable(env):
        return subprocess.Popen(argv(module, args), stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=stdout, env=env, cwd=cwd)
    with open(os.devnull, "rb") as null:
        return Forked(module, args, env=env, cwd=cwd if cwd is not None else os.getcwd(),
                      stdio=(null.fileno(), stdout, stdout))


def _text(data: bytes) -> str:
    """As ``subprocess.run(text=True)`` decodes (UTF-8 here, universal newlines)."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8").read()


def run(*args: str, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
        input: str | None = None,
        timeout: float = 60, module: str = "sandboxd") -> subprocess.CompletedProcess[str]:
    """``python -m sandboxd *args`` to its end (``env``: the whole environment, this
    process's when None; ``input``: its stdin, else ``/dev/null``). A command still running
    after ``timeout`` seconds is killed and :class:`subprocess.TimeoutExpired` raised.
    ``module``: another module to run as ``__main__`` (the runner's own tests). A fresh
    interpreter when its interpreter settings are not the server's (:func:`forkable`)."""
    env = os.environ if env is None else env
    if not forkable(env):
        return subprocess.run(argv(module, args), capture_output=True,
                              text=True, env=env, cwd=cwd, input=input, timeout=timeout,
                              stdin=None if input is not None else subprocess.DEVNULL)
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as out, \
            tempfile.TemporaryFile() as err:
        if input is not None:
            stdin.write(input.encode())
            stdin.seek(0)
        with open(os.devnull, "rb") as null:
            source: IO[bytes] = stdin if input is not None else null
            proc = Forked(module, args, env=env,
                          cwd=cwd if cwd is not None else os.getcwd(),
                          stdio=(source.fileno(), out.fileno(), err.fileno()))
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()  # reaped: nothing of it is left
            raise
        out.seek(0)
        err.seek(0)
        stdout, stderr = _text(out.read()), _text(err.read())
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
