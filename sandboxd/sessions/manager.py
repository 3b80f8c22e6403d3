"""Sessions and their workspaces.

A session owns a workspace directory ``<state>/workspaces/<session id>`` with a sliding TTL and a
size quota, and belongs to the client that created it: another client gets "not found", never a
hint that the session exists. A call without a session gets a fresh temporary workspace
``<state>/workspaces/tmp-<invocation id>`` that is deleted when the call ends.

Session metadata lives in ``<state>/sessions/<id>.json`` so that a restarted daemon recovers
unexpired sessions; :meth:`SessionManager.sweep` deletes expired sessions, orphaned workspaces
(unmounting them first) and every temporary workspace left by a crash. One workspace that
cannot be removed is logged and reported; it never stops the sweep, the start-up or the expiry
loop.

Workspaces are made, measured and removed by :mod:`sandboxd.workspaces.quota` (a size- and
inode-limited tmpfs each when the daemon may mount, else a plain directory) and
:mod:`sandboxd.workspaces.fstree` (iterative, descriptor-based, bounded walks). Everything that
walks or
removes a tree runs in a worker thread, never on the event loop. With tmpfs workspaces the
contents live in memory: with ``sessions_survive_restart`` (the default) a clean *stop* leaves
them mounted, as a *crash* does, and the next start re-adopts every session whose workspace
checks out (:func:`sandboxd.sessions.restarts.workspace_problem`; the others are ended); without it
a
stop ends every session (unmounted, removed, audited).

When the daemon runs as root, every workspace is owned (mode 0700) by its own sandbox identity
from the uid pool (:mod:`sandboxd.host.uids`): a session's uid is taken when it is created, stored
in its metadata (so a restarted daemon gives it back) and released when it goes; a call without
a session holds one for the call. Nobody else can read a workspace, not even another sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from sandboxd.errors import HostFull
from sandboxd.host.uids import UidPool, UidPoolExhausted
from sandboxd.models import new_id
from sandboxd.sessions import recovery
from sandboxd.sessions.calls import SessionCalls
from sandboxd.sessions.record import (
    Session,
    SessionEnded,
    SessionError,
    SessionLimitReached,
    SessionNotFound,
    SessionOverQuota,
)
from sandboxd.util.reservations import Cap, CapReached, Ledger, Reservation
from sandboxd.workspaces.quota import (
    Usage,
    WorkspaceFS,
    is_mount_point,
    mounted_usage,
    mounts_below,
)

log = logging.getLogger("sandboxd.sessions.manager")

TEMP_PREFIX = "tmp-"

__all__ = [
    "TEMP_PREFIX",
    "Prepared",
    "Session",
    "SessionEnded",
    "SessionError",
    "SessionLimitReached",
    "SessionManager",
    "SessionNotFound",
    "SessionOverQuota",
]


@dataclass(frozen=True)
class Prepared:
    """A session's id, uid and workspace, made before it is registered."""

    sid: str
    uid: int | None
    workspace: Path


#: how far ahead of a session's expiry :meth:`SessionManager.touch` writes it to its file
TOUCH_AHEAD_S = 60.0


class SessionManager:
    """Creates, finds, expires and sweeps sessions and temporary workspaces."""

    def __init__(self, state_dir: Path, *, ttl_s: float, quota_bytes: int,
                 max_per_client: int, uids: UidPool | None, keep_free: int = 0,
                 quota_entries: int = 65536, quota_mode: str = "auto",
                 node_id: str = "") -> None:
        self.root = state_dir / "workspaces"
        self.meta_dir = state_dir / "sessions"
        self.ttl_s = ttl_s
        self.quota_bytes = quota_bytes
        self.quota_entries = quota_entries
        self.max_per_client = max_per_client
        self.uids = uids  # per-sandbox identities, when the daemon can change them
        self.keep_free = keep_free  # uids sessions leave for one-shot calls and warm containers
        self.fs = WorkspaceFS(self.root, quota_bytes=quota_bytes, quota_entries=quota_entries,
                              setting=quota_mode)
        self._sessions: dict[str, Session] = {}
        self.node_id = node_id  # new session ids carry it (ses_<node>_<random>)
        #: sessions the last sweep did not re-adopt because a check failed: id -> why
        self.refused: dict[str, tuple[Session, str]] = {}
        self._saved_expiry: dict[str, float] = {}  # the expiry each session's file holds
        self.calls = SessionCalls()  # each session's calls in flight, for its end
        self._creating: Ledger[str] = Ledger()  # by client: sessions being created now

    # ------------------------------------------------------------ start-up

    def sweep(self) -> dict[str, list[str]]:
        """Recover unexpired sessions from disk; delete expired ones, orphaned workspaces and
        temporary workspaces left by a crash (:func:`sandboxd.sessions.recovery.sweep`).
        Blocks: the daemon runs it in a thread before it serves."""
        return recovery.sweep(self, time.time())

    # ------------------------------------------------------------ sessions

    def reserve_places(self, client: str, count: int = 1) -> list[Reservation[str]]:
        """``count`` places under ``max_per_client`` for sessions about to be made, all or
        none (:class:`SessionLimitReached`). Synchronous: call it before the first await."""
        places: list[Reservation[str]] = []
        for _ in range(count):
            held = len(self.registered(client)) + self._creating.held(client)
            try:
                places.append(self._creating.reserve(
                    client, Cap("max_sessions_per_client", held, self.max_per_client)))
            except CapReached:
                for place in places:
                    place.release()
                more = f"; {count} more were asked for" if count > 1 else ""
                raise SessionLimitReached(
                    f"client '{client}' already has {held - len(places)} sessions (the maximum "
                    f"is {self.max_per_client}, those being created included{more}); delete "
                    "one first") from None
        return places

    async def create(self, client: str, ttl_s: float | None = None, *,
                     place: Reservation[str] | None = None,
                     fill: Callable[[Path, int | None], Awaitable[None]] | None = None,
                     ready: Prepared | None = None) -> Session:
        """A new session with an empty workspace (``fill``: what fills it, before the session
        is registered; ``ready``: one :meth:`prepare` made ahead, whose id, uid and workspace
        it takes). Its place under ``max_per_client`` is reserved before the first await
        (:mod:`sandboxd.util.reservations`; ``place``: one :meth:`reserve_places` took) and held
        until it is registered: a burst of creations admits exactly the cap."""
        if place is None:
            (place,) = self.reserve_places(client)
        try:
            made = ready if ready is not None else await self.prepare()
            try:
                if fill is not None:
                    await fill(made.workspace, made.uid)
                return self._register(client, ttl_s, made)
            except BaseException:
                await self.unprepare(made)
                raise
        finally:
            place.release()  # registered (it counts itself) or failed

    async def prepare(self) -> Prepared:
        """A new session's id, uid and empty workspace, not registered yet (:meth:`create`
        registers it; :meth:`unprepare` undoes it). :class:`HostFull` when no uid is left."""
        sid = new_id("ses", self.node_id or None)
        uid = None
        if self.uids is not None:
            try:
                uid = self.uids.acquire(sid, keep_free=self.keep_free)
            except UidPoolExhausted as exc:
                raise HostFull(f"the host is full, no session can be created now: {exc} "
                               "(sandbox_uid_count)", full="sandbox_uids") from None
        try:
            return Prepared(sid, uid, await self._create_workspace(sid, uid))
        except BaseException:  # whatever of it was made goes
            await self.unprepare(Prepared(sid, uid, self.root / sid))
            raise

    async def unprepare(self, made: Prepared) -> None:
        """Undo :meth:`prepare` (or a registration that failed): the workspace, the session's
        files and its uid go."""
        sid = made.sid
        self._sessions.pop(sid, None)
        await asyncio.to_thread(self._remove_workspace, self.root / sid)
        (self.meta_dir / f"{sid}.json").unlink(missing_ok=True)
        self.meta_dir.joinpath(f"{sid}.tmp").unlink(missing_ok=True)
        if self.uids is not None:
            self.uids.release(sid)

    def _register(self, client: str, ttl_s: float | None, made: Prepared) -> Session:
        """Register a prepared session of ``client`` (its file written before it is used)."""
        ttl = min(ttl_s or self.ttl_s, self.ttl_s)
        now = time.time()
        session = Session(made.sid, client, now, now + ttl, ttl, self.quota_bytes,
                          str(made.workspace), made.uid, self.quota_entries, self.node_id)
        self._sessions[made.sid] = session
        # its file holds the expiry ahead from the start (as :meth:`touch` writes it): the
        # touch of its first call then rewrites nothing
        self._save(replace(session, expires_at=session.expires_at + self._ahead(session)))
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
        if session is None or session.client != client or not self._live(session, time.time()):
            raise SessionNotFound(f"session '{session_id}' does not exist or has expired")
        return session

    def owned(self, client: str) -> list[Session]:
        """The client's live (unexpired) sessions."""
        now = time.time()
        return [s for s in self._sessions.values() if s.client == client and self._live(s, now)]

    def _live(self, session: Session, now: float) -> bool:
        """Unexpired: its TTL has not run out since its last call, or a call of it runs."""
        return session.expires_at > now or self.calls.running(session.id)

    def live(self, session: Session) -> bool:
        """The session has not ended: it is still registered (an ended one never comes back)."""
        return self._sessions.get(session.id) is session

    def check_live(self, session: Session | None) -> None:
        """:class:`SessionEnded` when ``session`` has ended (None: no session, nothing to
        check). A call checks again after every wait (its slot, its kernel)."""
        if session is not None and not self.live(session):
            raise SessionEnded(f"session '{session.id}' ended before the call could run")

    @contextlib.contextmanager
    def in_use(self, session: Session | None) -> Iterator[None]:
        """A call of ``session`` runs (None: no session): the session does not expire
        meanwhile, however long the call takes, and one whose TTL ran out during the call
        gets its whole TTL again from the call's end (:meth:`touch`). Its end
        (:meth:`end_calls`) waits for the call to be over."""
        if session is None:
            yield
            return
        self.check_live(session)
        with self.calls.counted(session.id) as last:
            yield
        if last[0] and session.expires_at <= time.time() and session.id in self._sessions:
            self.touch(session)

    @contextlib.contextmanager
    def cancellable(self, session: Session | None) -> Iterator[None]:
        """The part of a call of ``session`` (inside :meth:`in_use`) that the session's end
        cancels: its wait for a slot and a kernel, and its run. :class:`SessionEnded` when
        the session has ended already."""
        if session is None:
            yield
            return
        self.check_live(session)
        with self.calls.cancellable(session.id):
            yield

    async def end_calls(self, session: Session) -> int:
        """:meth:`SessionCalls.end` of a session that has ended (:meth:`forget`)."""
        return await self.calls.end(session.id)

    def touch(self, session: Session) -> None:
        """Slide the session's expiry forward after a use. Its file is rewritten only when
        the expiry passes the one the file holds, written ahead by TOUCH_AHEAD_S (a tenth of
        the TTL at most): not on every call, and a session recovered after a crash lives at
        most that much longer than it would have, never shorter. A file that cannot be
        written is logged: the expiry holds in memory, and the next touch saves it."""
        session.expires_at = time.time() + session.ttl_s
        if session.expires_at > self._saved_expiry.get(session.id, 0.0):
            try:
                self._save(replace(session,
                                   expires_at=session.expires_at + self._ahead(session)))
            except OSError as exc:  # the call ran: its result goes out and into the audit log
                log.warning("session %s: expiry not saved (%s); it stays in memory",
                            session.id, exc)

    def retime(self, session: Session, ttl_s: float) -> None:
        """Give ``session`` a new TTL (lowered to the daemon's maximum) counted from now and
        save it: E2B's ``set_timeout`` (:mod:`sandboxd.api.e2b`), shorter or longer."""
        session.ttl_s = min(ttl_s, self.ttl_s)
        self._saved_expiry.pop(session.id, None)  # a shorter expiry is written too
        self.touch(session)

    async def usage(self, workspace: Path) -> Usage:
        """A workspace's usage: a tmpfs's ``statvfs`` (memory only) right here, as a thread
        hop costs more than it and a call takes two (per-call CPU); a bounded walk otherwise,
        in a worker thread so that a huge workspace never stalls the event loop."""
        if self.fs.kernel:
            mounted = mounted_usage(workspace, self.fs.quota_bytes, self.fs.quota_entries)
            if mounted is not None:
                return mounted
        return await asyncio.to_thread(self.fs.usage, workspace)

    async def check_quota(self, session: Session) -> Usage:
        """The workspace's usage; :class:`SessionOverQuota` when over its quota (which only an
        advisory quota allows: a tmpfs workspace cannot get over its limits)."""
        used = await self.usage(Path(session.workspace))
        if used.over:
            if used.exact:
                what = f"{used.bytes} bytes in {used.entries} entries"
            elif used.entries > used.quota_entries:
                what = f"more than {used.quota_entries} entries"
            else:
                what = f"too many entries to count in time (more than {used.entries})"
            raise SessionOverQuota(
                f"session workspace uses {what}, over its quota of {used.quota_bytes} bytes "
                f"and {used.quota_entries} files and directories; delete files or start a new "
                "session"
            )
        return used

    def expired(self) -> list[Session]:
        """Sessions whose TTL has passed (still registered) and with no call running."""
        now = time.time()
        return [s for s in self._sessions.values() if not self._live(s, now)]

    def registered(self, client: str | None = None) -> list[Session]:
        """Every registered session (expired ones not yet ended included), or ``client``'s."""
        return [s for s in self._sessions.values() if client is None or s.client == client]

    def holds(self, session: Session) -> bool:
        """Whether ``session`` is registered (not ended): only then may its file be written."""
        return self._sessions.get(session.id) is session

    def forget(self, session: Session) -> bool:
        """Unregister a session (no call finds it from now on); False when it was not
        registered (ended already)."""
        return self._sessions.pop(session.id, None) is not None

    async def remove(self, session: Session) -> bool:
        """Delete a forgotten session's workspace (unmounted first), metadata and uid. False
        (logged) when the workspace could not be removed completely."""
        return await asyncio.to_thread(self._remove_files, session.id)

    async def drop(self, session: Session) -> bool:
        """:meth:`forget` and :meth:`remove` a session regardless of owner."""
        self.forget(session)
        return await self.remove(session)

    async def expire_loop(self, end: Callable[[Session], Awaitable[object]],
                          interval_s: float = 15.0) -> None:
        """Forever: end the sessions past their TTL with ``end`` (the service's one close
        path: backends, workspace, audit). A session whose ending fails is logged and
        dropped; it never ends the loop."""
        while True:
            await asyncio.sleep(interval_s)
            for session in self.expired():
                try:
                    await end(session)
                except Exception:
                    log.exception("could not expire session %s", session.id)
                    with contextlib.suppress(Exception):
                        await self.drop(session)

    async def close(self, end: Callable[[Session], Awaitable[object]], *,
                    survive: bool = False) -> None:
        """Daemon stop. ``survive`` (``sessions_survive_restart``): every session stays, its
        tmpfs mounted, for the next start to re-adopt. Otherwise tmpfs workspaces must not
        outlive the daemon: every session whose workspace is a mount is ended (with ``end``,
        the service's one close path). Either way any other mount left below the workspaces
        is removed; plain-directory sessions stay for the next start."""
        for session in list(self._sessions.values()):
            if survive or not is_mount_point(Path(session.workspace)):
                continue
            try:
                await end(session)
            except Exception:
                log.exception("could not end session %s at shutdown", session.id)
                with contextlib.suppress(Exception):
                    await self.drop(session)
        keep = {s.id for s in self._sessions.values()}
        for point in mounts_below(self.root):
            if point.parent == self.root and point.name in keep:
                continue
            try:
                await asyncio.to_thread(self.fs.remove, point)
            except OSError as exc:
                log.error("shutdown: could not remove the workspace %s: %s", point, exc)
        self.fs.close()

    # ------------------------------------------------------------ temporary workspaces

    @contextlib.asynccontextmanager
    async def workspace(self, session: Session | None,
                        invocation_id: str) -> AsyncIterator[Path]:
        """The workspace of one call: its session's, or a :meth:`temporary` one."""
        if session is not None:
            yield Path(session.workspace)
        else:
            async with self.temporary(invocation_id) as path:
                yield path

    @contextlib.asynccontextmanager
    async def temporary(self, invocation_id: str) -> AsyncIterator[Path]:
        """A fresh workspace for one call without a session (with the same quota as a session's
        workspace), unmounted and removed afterwards (:meth:`WorkspaceFS.remove_soon`). A crash
        before that is covered by :meth:`sweep`."""
        name = TEMP_PREFIX + invocation_id
        uid = self.uids.acquire(name) if self.uids is not None else None
        try:
            path = await self._create_workspace(name, uid)
        except BaseException:
            if self.uids is not None:
                self.uids.release(name)
            raise
        try:
            yield path
        finally:
            # the call's processes are gone (backends verify it before returning): the uid
            # is free again, its files go with the workspace
            if self.uids is not None:
                self.uids.release(name)
            await asyncio.shield(self._remove_workspace_soon(path))

    # ------------------------------------------------------------ helpers

    async def _create_workspace(self, name: str, uid: int | None) -> Path:
        """:meth:`WorkspaceFS.create_soon`. Cancelled meanwhile, the creation still finishes;
        what it made is then removed (never a mount left behind by a cancel)."""
        loop = asyncio.get_running_loop()
        future = self.fs.create_soon(name, uid)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            def discard(done: asyncio.Future[Path]) -> None:
                if not done.cancelled() and done.exception() is None:
                    loop.run_in_executor(None, self._remove_workspace, done.result())

            future.add_done_callback(discard)
            raise

    @staticmethod
    def _ahead(session: Session) -> float:
        """How far ahead of the session's expiry its file may hold it (see :meth:`touch`)."""
        return min(TOUCH_AHEAD_S, session.ttl_s / 10)

    def save(self, session: Session) -> None:
        """Write the session's metadata (atomically). The expiry its file holds ahead stays
        (never earlier than the live one, at most :meth:`_ahead` later), so that the next
        :meth:`touch` need not write it again."""
        kept = self._saved_expiry.get(session.id, 0.0)
        self._save(replace(session, expires_at=kept) if kept > session.expires_at else session)

    def _save(self, session: Session) -> None:
        target = self.meta_dir / f"{session.id}.json"
        tmp = target.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(session), fh)
        os.replace(tmp, target)
        self._saved_expiry[session.id] = session.expires_at

    def _remove_workspace(self, path: Path) -> bool:
        try:
            self.fs.remove(path)
        except OSError as exc:
            log.error("could not remove the workspace %s: %s", path, exc)
            return False
        return True

    async def _remove_workspace_soon(self, path: Path) -> bool:
        """:meth:`_remove_workspace` from the event loop (:meth:`WorkspaceFS.remove_soon`)."""
        try:
            await self.fs.remove_soon(path)
        except OSError as exc:
            log.error("could not remove the workspace %s: %s", path, exc)
            return False
        return True

    def _remove_files(self, session_id: str) -> bool:
        """Blocking: unmount and remove the workspace, delete the metadata. False (logged)
        when the workspace could not be removed completely (the next sweep tries again)."""
        ok = self._remove_workspace(self.root / session_id)
        (self.meta_dir / f"{session_id}.json").unlink(missing_ok=True)
        self._saved_expiry.pop(session_id, None)
        if self.uids is not None:
            self.uids.release(session_id)
        return ok

