"""Idle session kernels hibernated to disk, woken by their session's next call.

A restricted kernel holds a few MiB of memory for as long as its session lives, most of it
pages of the zygote it wrote (CPython 3.11 writes reference counts as it reads). With
``kernel_hibernate_after_s`` set (0, the default: never), a kernel that has run no call for
that long is asked, between calls and under its session's lock, for a snapshot of its state
(:func:`.carry.snapshot_locked`, the same pickling a fork's state takes, inside the kernel's
own sandbox); the bytes are written to ``<state_dir>/hibernated/`` (0600, the daemon's) and
the kernel is ended and verified gone. The session's next ``python`` call starts a fresh
kernel that restores them before it runs the call (the fork's path): the result says
``kernel.fresh: false`` and ``calls`` goes on counting; a state that cannot be read or
restored makes the call say so (``kernel.lost``, reason ``not_restored``, the message why; a
state that does not restore does not run the code).

Only a whole state hibernates: a kernel holding a name that cannot be pickled (an open file,
a generator), or more than ``fork_state_bytes``, stays awake (until a later call changes its
state); so does one when the disk lacks room. The modules' own state a session sets
(``random``'s generator, ``decimal``'s context) wakes with it (:mod:`.lang.module_state`);
not carried: other module-level settings, object ids, the iteration order of a set (rebuilt
from the pickle).

Truth across a restart: a hibernated kernel is one of the session's live kernels
(:meth:`.KernelPool.live`), so the session's metadata lists it as any other; a stop or a crash
loses it as it loses a kernel in memory (``daemon_restart``, ``daemon_crash``), and a start
clears the directory. It does not count against ``max_kernels`` nor the memory headroom
(``live_kernels(..., resident=True)`` leaves it out): waking it is admitted as a new kernel is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import time
from collections.abc import Awaitable, Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxd.backends.restricted.zygote_protocol import write_all
from sandboxd.models import Limits, Result
from sandboxd.util.deadline import stop_task
from sandboxd.workspaces import fstree

if TYPE_CHECKING:
    from sandboxd.backends.base import KernelState
    from sandboxd.backends.restricted.kernel import KernelPool, SessionKernel

#: a live kernel's state pickled in its sandbox, the session's lock held
#: (:func:`.carry.snapshot_locked`: pool, session, kernel, byte limit, deadline)
Snapshot = Callable[["KernelPool", str, "SessionKernel", int, float], Awaitable["KernelState"]]

log = logging.getLogger("sandboxd.restricted")

#: how long a kernel's snapshot may take before it is given up (the kernel is then ended:
#: a kernel that does not answer a snapshot in time is lost, as a fork's parent is)
SNAPSHOT_S = 60.0
#: a state is written only while its filesystem keeps this much free after it (the audit log
#: and the sessions' files live there too), or this share of it if that is more
MIN_FREE_BYTES = 1024 ** 3
MIN_FREE_SHARE = 0.05
#: ``kernel.reason`` of a call whose session's hibernated state was lost as it woke
NOT_RESTORED = "not_restored"
#: the shortest pause of the sweep between two looks
MIN_PAUSE_S = 0.05
#: a session id that names a state file as it is (the daemon makes them; anything else
#: stays awake rather than become a path)
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


@dataclass(frozen=True)
class Asleep:
    """A hibernated kernel: where its state is, and what its next call must carry on."""

    path: Path
    size: int
    #: calls run in it before it was hibernated (its next call's ``kernel.calls`` goes on)
    calls: int
    #: the session's limits its first call set (memory, CPU share, pids): kept by the next
    limits: Limits
    workspace: str
    uid: int | None


@dataclass
class Woken:
    """A sleeping kernel taken by its session's next call."""

    asleep: Asleep
    #: its state, as written (empty: lost)
    state: bytes
    #: why its state is lost (it could not be read, or the fresh kernel could not restore
    #: it), else None
    lost: str | None = None

    def tell(self, result: Result) -> Result:
        """The call's result, which says that the session's state is lost when it is (the
        kernel it ran in is fresh: ``kernel.lost``, reason ``not_restored``), unless the call
        lost its kernel for a reason of its own."""
        kernel = result.kernel
        if self.lost is None or kernel is None or kernel.lost:
            return result
        result.kernel = kernel.model_copy(update={"lost": True, "reason": NOT_RESTORED})
        said = (f"the session's kernel was hibernated and {self.lost}: its variables are lost "
                "(its files are kept)")
        result.message = said if result.message is None else f"{said}; {result.message}"
        return result


class Hibernation:
    """The kernels of one :class:`.KernelPool` that sleep on disk, and the task that puts the
    idle ones to sleep."""

    def __init__(self, pool: KernelPool, directory: Path, after_s: float,
                 limit_bytes: int, snapshot: Snapshot) -> None:
        self.pool = pool
        #: :func:`.carry.snapshot_locked` (passed in: carry imports the kernel module)
        self.snapshot = snapshot
        self.directory = directory
        self.after_s = after_s
        self.limit_bytes = limit_bytes
        self.asleep: dict[str, Asleep] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.after_s > 0

    def start(self) -> None:
        """Clear what a previous daemon left (its kernels are gone: the restart bookkeeping
        says so) and start the sweep."""
        fstree.remove_tree_quietly(self.directory)
        if self.enabled and self._task is None:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.directory, 0o700)
            self._task = asyncio.create_task(self._sweep(), name="restricted-hibernation")

    async def stop(self) -> None:
        """End the sweep and forget every sleeping kernel (its state file goes)."""
        await stop_task(self._task)
        self._task = None
        self.asleep.clear()
        # (a write under way in its thread when the sweep was cancelled ends in here too)
        fstree.remove_tree_quietly(self.directory)

    def sessions(self) -> AbstractSet[str]:
        """The sessions whose kernel sleeps (a view: never one whose kernel runs, see
        :meth:`take` and :meth:`hibernate`)."""
        return self.asleep.keys()

    async def state(self, sid: str) -> bytes | None:
        """A sleeping kernel's state (for a fork of its session), without waking it."""
        asleep = self.asleep.get(sid)
        return None if asleep is None else await asyncio.to_thread(_read, asleep)

    def drop(self, sid: str) -> bool:
        """Forget the session's sleeping kernel (restarted, closed): True if there was one."""
        asleep = self.asleep.pop(sid, None)
        if asleep is None:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(asleep.path)
        return True

    async def read(self, sid: str) -> Woken | None:
        """The session's sleeping kernel, if it has one, and its state, read (it sleeps on
        until :meth:`take`). A state that cannot be read is lost, and the call that wakes
        it says so."""
        asleep = self.asleep.get(sid)
        if asleep is None:
            return None
        try:
            return Woken(asleep, await asyncio.to_thread(_read, asleep))
        except OSError as exc:
            log.warning("restricted: session %s: the state of its hibernated kernel cannot be "
                        "read (%s): it is lost", sid, exc)
            return Woken(asleep, b"", lost=f"its saved state cannot be read ({exc})")

    def take(self, sid: str, read: Woken | None) -> Woken | None:
        """Wake the session's sleeping kernel as its fresh process starts (no await between
        the two): what :meth:`read` read, unless it no longer sleeps as it was then (a
        restart or close dropped it meanwhile: its state must not come back)."""
        if read is None or self.asleep.get(sid) is not read.asleep:
            return None
        self.drop(sid)
        return read

    # ----------------------------------------------------------------- the sweep

    def _due(self, k: SessionKernel, now: float) -> bool:
        return (now - k.idle_since >= self.after_s and not k.busy
                and k.unpicklable_at != k.calls and k.alive)

    async def _sweep(self) -> None:
        while True:
            now = time.monotonic()
            # a kernel that is busy now, or starts after this look, is due after_s from now
            # at the earliest; one that died between calls is never due (its next call
            # replaces it)
            wake_at = now + self.after_s
            for sid, k in list(self.pool.kernels.items()):
                if k.busy or k.unpicklable_at == k.calls:
                    continue
                due_at = k.idle_since + self.after_s
                if due_at > now:
                    wake_at = min(wake_at, due_at)
                elif k.alive:
                    try:
                        await self.hibernate(sid, k)
                    except Exception:  # one kernel's failure never stops the others'
                        log.exception("restricted: session %s: hibernation failed", sid)
            await asyncio.sleep(max(MIN_PAUSE_S, wake_at - time.monotonic()))

    async def hibernate(self, sid: str, k: SessionKernel) -> bool:
        """Put the session's idle kernel ``k`` to sleep: True when it sleeps now. A call that
        holds or waits for the session's lock keeps it awake."""
        pool = self.pool
        lock = pool.locks.setdefault(sid, asyncio.Lock())
        if lock.locked() or not SESSION_ID.fullmatch(sid):
            return False
        async with lock:
            if pool.kernels.get(sid) is not k or not self._due(k, time.monotonic()):
                return False
            state = await self.snapshot(pool, sid, k, self.limit_bytes,
                                        time.monotonic() + SNAPSHOT_S)
            if not k.alive:  # the snapshot broke or ran out of time: the kernel was ended
                log.warning("restricted: session %s: its kernel was lost as it was to be "
                            "hibernated: %s", sid, state.reason)
                return False
            why = _incomplete(state.blob, state.not_carried, state.reason)
            if why is None:
                why = await asyncio.to_thread(self._write, sid, state.blob or b"")
            if why is not None:
                k.unpicklable_at = k.calls
                log.info("restricted: session %s: its kernel stays awake: %s", sid, why)
                return False
            if k.ended or sid in pool.closed:  # restarted or closed meanwhile: that ends it
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path(sid))
                return False
            pool._ending(sid, k, "hibernated")  # it leaves the running set as it falls asleep
            self.asleep[sid] = Asleep(path=self._path(sid), size=len(state.blob or b""),
                                      calls=k.calls, limits=k.limits, workspace=k.workspace,
                                      uid=k.uid)
            await pool._stop(sid, k, "hibernated")
            return True

    def _path(self, sid: str) -> Path:
        return self.directory / f"{sid}.state"

    def _write(self, sid: str, blob: bytes) -> str | None:
        """Write the state (a new 0600 file); why it was not written, else None."""
        path = self._path(sid)
        try:
            disk = shutil.disk_usage(self.directory)
            if disk.free - len(blob) < max(MIN_FREE_BYTES, disk.total * MIN_FREE_SHARE):
                return "the disk has too little room to hibernate it"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                         | os.O_NOFOLLOW, 0o600)
            try:
                write_all(fd, blob)
            finally:
                os.close(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(path)
            return f"its state could not be written ({exc.strerror or exc})"
        return None


def _incomplete(blob: bytes | None, not_carried: dict[str, str],
                reason: str | None) -> str | None:
    """Why a snapshot does not carry the kernel's whole state, or None when it does."""
    if blob is None:
        return reason or "it sent no state"
    if not_carried:
        names = ", ".join(sorted(not_carried)[:5])
        return f"names that cannot be pickled ({names}{', ...' if len(not_carried) > 5 else ''})"
    return None


def _read(asleep: Asleep) -> bytes:
    """A sleeping kernel's state as written (no more than its recorded size)."""
    with open(asleep.path, "rb") as f:
        data = f.read(asleep.size + 1)
    if len(data) != asleep.size:
        raise OSError(f"{asleep.path} holds {len(data)} bytes, not {asleep.size}")
    return data
