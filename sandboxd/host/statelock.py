"""The daemon's lock on its state directory: an exclusive ``flock`` on
``<state_dir>/daemon.lock``, taken by ``sandboxd serve`` before it touches anything there and
held for the life of the process (the kernel releases it when the process ends, however it
ends). The file holds the daemon's pid, for information only: the lock is the truth.

* A second ``serve`` on the same directory refuses to start (:class:`StateDirLocked`).
* The admin commands ask :func:`holder` (a non-blocking try): when a daemon holds the lock,
  its containers, run directory, cgroups and files are not theirs to remove.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from sandboxd.errors import SandboxdError

LOCK_NAME = "daemon.lock"


class StateDirLocked(SandboxdError):
    """Another process (a live daemon) holds the state directory's lock."""

    code = "state-dir-locked"

    def __init__(self, state_dir: Path, pid: int | None) -> None:
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"the state directory {state_dir} is in use by another sandboxd "
                         f"daemon ({who} holds {state_dir / LOCK_NAME}); stop it first or "
                         "give this one its own --state-dir")
        self.state_dir = state_dir
        self.pid = pid


@dataclass(frozen=True)
class Holder:
    """Who holds the lock: ``pid`` as the file says (None when unreadable); ``why``: the lock
    could not be tried, so a live daemon is assumed."""

    path: Path
    pid: int | None
    why: str | None = None

    def __str__(self) -> str:
        if self.why:
            return f"{self.path} {self.why}: a daemon may hold it"
        return f"a daemon holds {self.path}, pid {self.pid if self.pid else '?'}"


def lock_path(state_dir: Path) -> Path:
    """Where the lock of ``state_dir`` lives."""
    return Path(state_dir) / LOCK_NAME


def _read_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    return None


def acquire(state_dir: Path) -> int:
    """Take the lock of ``state_dir`` (created 0700 if needed) for this process and write our
    pid into it; returns the descriptor, to keep open for as long as the lock is held.
    :class:`StateDirLocked` when a daemon holds it already."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(lock_path(state_dir), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        pid = _read_pid(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StateDirLocked(state_dir, pid) from None
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:  # informational only: the lock is held either way
        pass
    return fd


def holder(state_dir: Path) -> Holder | None:
    """The live daemon holding the lock of ``state_dir``, or None when none does. Tried
    without waiting, and released at once when it was free (nothing is created: a state
    directory without a lock file has no daemon). A lock file this process cannot open counts
    as held (the safe answer for a command that would otherwise clean up)."""
    path = lock_path(state_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Holder(path, None, f"cannot be opened: {exc.strerror or exc}")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return Holder(path, _read_pid(fd))
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
