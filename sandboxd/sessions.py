"""Sessions and their workspaces.

A session owns a workspace directory ``<state>/workspaces/<session id>`` with a sliding TTL and a
size quota, and belongs to the client that created it: another client gets "not found", never a
hint that the session exists. A call without a session gets a fresh temporary workspace
``<state>/workspaces/tmp-<invocation id>`` that is deleted when the call ends.

Session metadata lives in ``<state>/sessions/<id>.json`` so that a restarted daemon recovers
unexpired sessions; :meth:`SessionManager.sweep` deletes expired sessions, orphaned workspaces
and every temporary workspace left by a crash.

When the daemon runs as root, every workspace is owned (mode 0700) by its own sandbox identity
from the uid pool (:mod:`sandboxd.uids`): a session's uid is taken when it is created, stored
in its metadata (so a restarted daemon gives it back) and released when it goes; a call without
a session holds one for the call. Nobody else can read a workspace, not even another sandbox.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from sandboxd.models import new_id
from sandboxd.uids import UidPool, UidPoolExhausted, chown_tree

TEMP_PREFIX = "tmp-"


class SessionError(Exception):
    """Base class for session problems."""


class SessionNotFound(SessionError):
    """No such session for this client (or it expired)."""


class SessionLimitReached(SessionError):
    """The client already has the maximum number of sessions."""


class SessionOverQuota(SessionError):
    """The session's workspace uses more than its quota."""


@dataclass
class Session:
    """A session as stored on disk and returned by the API."""

    id: str
    client: str
    created_at: float
    expires_at: float
    ttl_s: float
    quota_bytes: int
    workspace: str
    uid: int | None = None  # its sandbox identity (uid = gid); None when the daemon is not root

    def public(self, usage_bytes: int) -> dict[str, object]:
        """The session as ``GET /v1/sessions/{id}`` shows it."""
        return {
            "id": self.id,
            "client": self.client,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "ttl_s": self.ttl_s,
            "quota_bytes": self.quota_bytes,
            "workspace_bytes": usage_bytes,
        }


def remove_tree_soon(path: Path) -> None:
    """Delete ``path`` recursively: off the event loop when one is running, else now."""
    import asyncio

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        shutil.rmtree(path, ignore_errors=True)
        return
    loop.run_in_executor(None, shutil.rmtree, path, True)


def directory_usage(path: Path) -> int:
    """Bytes used by regular files below ``path`` (symlinks are not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path, followlinks=False):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, name))
                total += st.st_blocks * 512 if st.st_blocks else st.st_size
    return total


class SessionManager:
    """Creates, finds, expires and sweeps sessions and temporary workspaces."""

    def __init__(self, state_dir: Path, *, ttl_s: float, quota_bytes: int,
                 max_per_client: int, uids: UidPool | None, keep_free: int = 0) -> None:
        self.root = state_dir / "workspaces"
        self.meta_dir = state_dir / "sessions"
        self.ttl_s = ttl_s
        self.quota_bytes = quota_bytes
        self.max_per_client = max_per_client
        self.uids = uids  # per-sandbox identities, when the daemon can change them
        self.keep_free = keep_free  # uids sessions leave for one-shot calls and warm containers
        self._sessions: dict[str, Session] = {}

    # ------------------------------------------------------------ start-up

    def sweep(self) -> dict[str, list[str]]:
        """Recover unexpired sessions from disk; delete expired ones, orphaned workspaces and
        temporary workspaces left by a crash. Returns what was recovered and removed."""
        for directory in (self.root, self.meta_dir):
            directory.mkdir(parents=True, exist_ok=True, mode=0o711)
            os.chmod(directory, 0o711)
        report: dict[str, list[str]] = {"recovered": [], "expired": [], "removed": []}
        now = time.time()
        for meta in self.meta_dir.glob("*.json"):
            try:
                session = Session(**json.loads(meta.read_text()))
            except (OSError, ValueError, TypeError):
                meta.unlink(missing_ok=True)
                report["removed"].append(meta.name)
                continue
            if session.expires_at <= now or not Path(session.workspace).is_dir():
                self._remove_files(session.id)
                report["expired"].append(session.id)
            else:
                self._recover_identity(session)
                self._sessions[session.id] = session
                report["recovered"].append(session.id)
        for entry in self.root.iterdir():
            if entry.name not in self._sessions:
                shutil.rmtree(entry, ignore_errors=True)
                report["removed"].append(entry.name)
        return report

    # ------------------------------------------------------------ sessions

    def create(self, client: str, ttl_s: float | None = None) -> Session:
        """A new session with an empty workspace."""
        owned = [s for s in self._sessions.values() if s.client == client]
        if len(owned) >= self.max_per_client:
            raise SessionLimitReached(
                f"client '{client}' already has {len(owned)} sessions (the maximum); "
                "delete one first"
            )
        ttl = min(ttl_s or self.ttl_s, self.ttl_s)
        now = time.time()
        sid = new_id("ses")
        uid = None
        if self.uids is not None:
            try:
                uid = self.uids.acquire(sid, keep_free=self.keep_free)
            except UidPoolExhausted as exc:
                raise SessionLimitReached(f"no session can be created now: {exc}") from None
        try:
            workspace = self._make_workspace(sid, uid)
            session = Session(sid, client, now, now + ttl, ttl, self.quota_bytes,
                              str(workspace), uid)
            self._sessions[sid] = session
            self._save(session)
        except BaseException:
            self._sessions.pop(sid, None)
            shutil.rmtree(self.root / sid, ignore_errors=True)
            (self.meta_dir / f"{sid}.json").unlink(missing_ok=True)
            self.meta_dir.joinpath(f"{sid}.tmp").unlink(missing_ok=True)
            if self.uids is not None:
                self.uids.release(sid)
            raise
        return session

    def identity(self, session: Session | None, invocation_id: str) -> int | None:
        """The uid (= gid) a call runs as: its session's, else the one its temporary workspace
        holds (see :meth:`temporary`); None when the daemon is not root."""
        if self.uids is None:
            return None
        if session is not None:
            return session.uid
        return self.uids.held(TEMP_PREFIX + invocation_id)

    def get(self, session_id: str, client: str) -> Session:
        """The client's live session, or :class:`SessionNotFound`."""
        session = self._sessions.get(session_id)
        if session is None or session.client != client or session.expires_at <= time.time():
            raise SessionNotFound(f"session '{session_id}' does not exist or has expired")
        return session

    def touch(self, session: Session) -> None:
        """Slide the session's expiry forward after a use."""
        session.expires_at = time.time() + session.ttl_s
        self._save(session)

    def check_quota(self, session: Session) -> int:
        """Workspace usage in bytes; :class:`SessionOverQuota` when over the quota."""
        used = directory_usage(Path(session.workspace))
        if used > session.quota_bytes:
            raise SessionOverQuota(
                f"session workspace uses {used} bytes, over its quota of {session.quota_bytes}; "
                "delete files (write_file with empty content) or start a new session"
            )
        return used

    def delete(self, session_id: str, client: str) -> Session:
        """Remove a session and its workspace."""
        session = self.get(session_id, client)
        self._sessions.pop(session_id, None)
        self._remove_files(session_id)
        return session

    def expired(self) -> list[Session]:
        """Sessions whose TTL has passed (still registered)."""
        now = time.time()
        return [s for s in self._sessions.values() if s.expires_at <= now]

    def drop(self, session: Session) -> None:
        """Forget and delete a session regardless of owner (expiry, shutdown cleanup)."""
        self._sessions.pop(session.id, None)
        self._remove_files(session.id)

    def all(self) -> list[Session]:
        return list(self._sessions.values())

    async def expire_loop(self, on_expire: Callable[[Session], Awaitable[None]],
                          interval_s: float = 15.0) -> None:
        """Forever: expire sessions past their TTL (call ``on_expire`` first)."""
        import asyncio

        while True:
            await asyncio.sleep(interval_s)
            for session in self.expired():
                await on_expire(session)
                self.drop(session)

    # ------------------------------------------------------------ temporary workspaces

    @contextlib.contextmanager
    def temporary(self, invocation_id: str) -> Iterator[Path]:
        """A fresh workspace for one call without a session; deleted afterwards (in a
        background thread when an event loop runs: removing a tree is slow and nothing waits
        for it; a crash before it is done is covered by :meth:`sweep`)."""
        name = TEMP_PREFIX + invocation_id
        uid = self.uids.acquire(name) if self.uids is not None else None
        try:
            path = self._make_workspace(name, uid)
        except BaseException:
            if self.uids is not None:
                self.uids.release(name)
            raise
        try:
            yield path
        finally:
            # the call's processes are gone (backends verify it before returning): the uid
            # is free again, its files go with the tree
            if self.uids is not None:
                self.uids.release(name)
            remove_tree_soon(path)

    # ------------------------------------------------------------ helpers

    def _make_workspace(self, name: str, uid: int | None) -> Path:
        path = self.root / name
        path.mkdir(mode=0o700)
        if uid is not None:
            os.chown(path, uid, uid)
        return path

    def _recover_identity(self, session: Session) -> None:
        """A recovered session keeps its uid; one without a usable uid (metadata of an older
        daemon, or a uid outside today's range) gets a new one and its files follow."""
        if self.uids is None:
            return
        if session.uid is not None and self.uids.adopt(session.id, session.uid):
            return
        session.uid = self.uids.acquire(session.id)
        chown_tree(Path(session.workspace), session.uid, session.uid)
        self._save(session)

    def _save(self, session: Session) -> None:
        target = self.meta_dir / f"{session.id}.json"
        tmp = target.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(session), fh)
        os.replace(tmp, target)

    def _remove_files(self, session_id: str) -> None:
        shutil.rmtree(self.root / session_id, ignore_errors=True)
        (self.meta_dir / f"{session_id}.json").unlink(missing_ok=True)
        if self.uids is not None:
            self.uids.release(session_id)
