"""Per-sandbox identities: a pool of uids, one per live sandbox (like isolate's box ids).

Every sandbox that can run code - a one-shot call, a session (its workspace and every call on
it, on either backend), a warm pool container - holds its own uid (gid = the same number)
from ``[sandbox_uid_first, sandbox_uid_first + sandbox_uid_count)`` for as long as it lives;
no two live sandboxes ever share one, so code that escapes one sandbox's language layer holds
no permission over another's processes or files (``kill``, ``prlimit``, ``ptrace`` all check
the uid).

The pool itself keeps no file: a session's uid is stored in its metadata and taken back by
:meth:`UidPool.adopt` when a restarted daemon recovers the session; one-shot and pool
identities die with the daemon (their workspaces, workers and containers are swept at
start-up). Only when the daemon runs as root is there a pool (otherwise code keeps the
daemon's uid and Landlock/seccomp are the boundary).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from sandboxd.config import Settings
from sandboxd.errors import SandboxdError


class UidPoolExhausted(SandboxdError, RuntimeError):
    """Every uid of the pool is held by a live sandbox."""

    code = "uid-pool-exhausted"


class UidPool:
    """Allocates uids to holders (session ids, invocation ids, container names)."""

    def __init__(self, first: int, count: int) -> None:
        if first <= 0 or count <= 0:
            raise ValueError("the sandbox uid range must be positive and non-empty")
        self.first = first
        self.count = count
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()
        self._next = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> UidPool | None:
        """The daemon's pool, or None when not root (identities cannot be changed)."""
        return cls.for_range(settings.sandbox_uid_first, settings.sandbox_uid_count)

    @classmethod
    def for_range(cls, first: int, count: int) -> UidPool | None:
        """A pool of ``count`` uids from ``first``, or None when not root."""
        if os.geteuid() != 0:
            return None
        return cls(first, count)

    def contains(self, uid: int) -> bool:
        return self.first <= uid < self.first + self.count

    def acquire(self, holder: str, *, keep_free: int = 0) -> int:
        """A uid no other live holder has (the holder's own one if it already has one).
        ``keep_free``: refuse unless more than this many uids stay free afterwards (sessions
        leave room for one-shot calls)."""
        with self._lock:
            if holder in self._held:
                return self._held[holder]
            if self.count - len(set(self._held.values())) <= keep_free:
                raise UidPoolExhausted(
                    f"all {self.count} sandbox identities are in use; try again later"
                )
            used = set(self._held.values())
            for i in range(self.count):  # round robin: a freed uid is reused last
                uid = self.first + (self._next + i) % self.count
                if uid not in used:
                    self._next = (uid - self.first + 1) % self.count
                    self._held[holder] = uid
                    return uid
            raise UidPoolExhausted("no free sandbox identity")  # pragma: no cover

    def adopt(self, holder: str, uid: int) -> bool:
        """Take back ``uid`` for ``holder`` (a recovered session); False when it is outside the
        pool or held by someone else (the caller then acquires a new one)."""
        with self._lock:
            if not self.contains(uid) or uid in self._held.values():
                return self._held.get(holder) == uid
            self._held[holder] = uid
            return True

    def hold_also(self, holder: str, uid: int) -> None:
        """``holder`` holds ``uid`` too (a sandbox of a session that ended whose end is not
        confirmed yet): the uid stays taken until every holder has released it."""
        with self._lock:
            self._held[holder] = uid

    def release(self, holder: str) -> None:
        with self._lock:
            self._held.pop(holder, None)

    def held(self, holder: str) -> int | None:
        with self._lock:
            return self._held.get(holder)

    @property
    def in_use(self) -> int:
        """Distinct uids held now."""
        with self._lock:
            return len(set(self._held.values()))


def identities(settings: Settings, root: bool) -> str:
    """Who sandbox code runs as under ``settings`` (``sandboxd doctor`` says it): as root, each
    sandbox's own uid of the pool; else restricted workers keep the daemon's uid and containers
    run as the image's user."""
    if root:
        last = settings.sandbox_uid_first + settings.sandbox_uid_count - 1
        return (f"each sandbox runs as its own uid (= gid) of {settings.sandbox_uid_first}-{last}"
                " (sandbox_uid_first, sandbox_uid_count)")
    return ("restricted workers keep this uid (Landlock is their filesystem boundary); "
            f"containers run as the image's user {settings.sandbox_uid}:{settings.sandbox_gid}")


def chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give every entry below ``root`` (and ``root``) to ``uid:gid`` (a recovered session whose
    identity changed): :func:`sandboxd.workspaces.fstree.chown_tree` - descriptor-based, iterative,
    never
    follows a symlink."""
    from sandboxd.workspaces import fstree

    fstree.chown_tree(root, uid, gid)
