"""Restarts keep sessions (issue 26): what a restarted daemon checks before it re-adopts a
session, and what a session's next call is told about a kernel the restart ended.

A clean stop with ``sessions_survive_restart`` (the default) ends no session: a tmpfs workspace
stays mounted (the mounts are the host's: a test daemon's namespace, or the unit's with
``sandboxd-quota.conf``, whose ``PrivateMounts=no`` propagates them to the host), and session
containers keep running with their kernels (:mod:`sandboxd.backends.container.adopt`). The
next start re-adopts a session only when its workspace checks out here: a real directory owned
by its sandbox uid and, with kernel quotas, the sandboxd tmpfs itself (type, source,
``nosuid,nodev``), never something mounted or planted in its place while no daemon watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sandboxd.deadline import within
from sandboxd.errors import AuditFailure
from sandboxd.models import Kernel, Result
from sandboxd.quotafs import FS_SOURCE, unescape_mountinfo

if TYPE_CHECKING:
    from sandboxd.audit import AuditLog
    from sandboxd.backends.base import Backend
    from sandboxd.config import Settings
    from sandboxd.recorder import AuditRecorder
    from sandboxd.sessions import Session, SessionManager

log = logging.getLogger("sandboxd")

#: ``kernel.reason`` of the first python call after a restart ended the session's kernel
DAEMON_RESTART = "daemon_restart"
#: what the model reads then (the files are kept; the variables are not)
RESTART_MESSAGE = ("the daemon restarted since this session's last call: its Python state "
                   "(variables, imports) was lost and this call ran in a fresh interpreter; "
                   "the workspace files are kept")


@runtime_checkable
class SessionKeeper(Protocol):
    """A backend whose session state can outlive the daemon (the container backend)."""

    adoption_failed: dict[str, str]  # after start: sessions whose kept state did not check out
    adopting: bool  # after start: its re-adoption is still under way

    def expect_sessions(self, expected: dict[str, tuple[str, str, int | None]]) -> None:
        """Before start: the recovered sessions, ``id -> (client, workspace, uid)``."""

    async def keep_sessions(self, session_ids: set[str]) -> set[str]:
        """At a clean stop, before close: keep what it can of these sessions."""

    async def adopted(self, session_id: str | None = None) -> None:
        """After start: until the re-adoption of what the last stop kept has ended, or has
        settled ``session_id``'s (it runs while the daemon serves, within
        ``adopt_timeout_s``)."""


def mount_of(path: Path) -> tuple[str, str, set[str]] | None:
    """``(fstype, source, options)`` of the (topmost) mount whose point is exactly ``path`` in
    this process's mount namespace, or None."""
    found = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            for line in fh:
                fields = line.split()
                if (len(fields) < 6 or " - " not in line
                        or unescape_mountinfo(fields[4]) != str(path)):
                    continue
                post = line.split(" - ", 1)[1].split()
                if len(post) >= 3:
                    opts = set(fields[5].split(",")) | set(post[2].split(","))
                    found = (post[0], unescape_mountinfo(post[1]), opts)
    except OSError:
        return None
    return found


def workspace_problem(path: Path, uid: int | None, *, tmpfs: bool) -> str | None:
    """Why the workspace ``path`` may not be re-adopted (None: it checks out): not a real
    directory, not owned by its sandbox ``uid``, or (``tmpfs``) not the sandboxd tmpfs."""
    if tmpfs:
        info = mount_of(path)
        if info is None:
            return "its workspace tmpfs is gone (unmounted, or its mount namespace ended)"
        fstype, source, opts = info
        if fstype != "tmpfs" or source != FS_SOURCE.decode():
            return f"something else is mounted on its workspace ({fstype} from {source})"
        if not {"nosuid", "nodev"} <= opts:
            return "its workspace mount lost nosuid/nodev"
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"its workspace cannot be read ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "its workspace is not a directory"
    if uid is not None and (st.st_uid, st.st_gid) != (uid, uid):
        return f"its workspace is owned by {st.st_uid}:{st.st_gid}, not by its sandbox {uid}"
    return None


def note_restart(result: Result) -> Result:
    """A session python call's result whose kernel the last restart ended: ``kernel.lost``
    with reason ``daemon_restart`` (the call itself ran in a fresh interpreter)."""
    if result.kernel is None:
        return result
    kernel: Kernel = result.kernel
    if kernel.lost:
        return result  # this call lost its new kernel too: that reason says more
    message = "; ".join(m for m in (result.message, RESTART_MESSAGE) if m)
    return result.model_copy(update={
        "kernel": kernel.model_copy(update={"lost": True, "reason": DAEMON_RESTART}),
        "message": message})


class SessionRestarts:
    """What the service does about restarts (a mixin of :class:`~sandboxd.service.Sandboxd`,
    which provides the attributes below): keep sessions at a clean stop, audit the recovery
    at start, tell a session's next python call that its kernel was lost."""

    sessions: SessionManager
    backends: dict[str, Backend]
    audit: AuditLog
    recorder: AuditRecorder
    settings: Settings
    #: the start's re-adoption and its audit, while the daemon serves (:meth:`_recover`)
    _recovery: asyncio.Task[None] | None = None

    def kernel_backends(self, session_id: str) -> list[str]:  # pragma: no cover - SessionOps
        raise NotImplementedError

    async def end_session(self, session: Session, event: str | None,
                          **fields: Any) -> dict[str, Any] | None:  # pragma: no cover
        raise NotImplementedError

    def _expect_recovered(self) -> None:
        """Before the backends start: tell the keepers which sessions the sweep recovered."""
        expected = {s.id: (s.client, s.workspace, s.uid) for s in self.sessions.registered()}
        for backend in self.backends.values():
            if isinstance(backend, SessionKeeper):
                backend.expect_sessions(expected)

    async def _keep_sessions(self) -> None:
        """Clean stop with ``sessions_survive_restart``: note each session's live kernels
        (restricted ones die with the daemon), then let the backends keep what they can."""
        registered = self.sessions.registered()
        for session in registered:
            # (a kernel lost at an earlier restart and not yet reported stays listed)
            at_stop = sorted(set(session.kernels_at_stop) | set(self.kernel_backends(session.id)))
            if at_stop != session.kernels_at_stop:
                session.kernels_at_stop = at_stop
                try:
                    self.sessions.save(session)
                except OSError as exc:
                    log.warning("session %s: kernels at stop not saved: %s", session.id, exc)
        ids = {s.id for s in registered}
        for name, backend in self.backends.items():
            if isinstance(backend, SessionKeeper):
                try:
                    kept = await backend.keep_sessions(ids)
                except Exception:
                    log.exception("backend %s could not keep its sessions", name)
                else:
                    log.info("backend %s kept %d session container(s)", name, len(kept))

    async def _recover(self) -> None:
        """In the background after start: wait for the keepers' re-adoption (each bounds its
        own by ``adopt_timeout_s``), then audit the recovery."""
        for backend in self.backends.values():
            if isinstance(backend, SessionKeeper):
                await backend.adopted()
        await self._audit_recovery()

    async def _start_recovery(self) -> None:
        """At start: the recovery's audit now, or in the background while a keeper still
        re-adopts (the daemon serves meanwhile; :meth:`recovered`)."""
        self._recovery = asyncio.create_task(self._recover(), name="session-recovery")
        if not any(isinstance(b, SessionKeeper) and b.adopting for b in self.backends.values()):
            await asyncio.wait({self._recovery})

    async def recovered(self, session: Session | None) -> None:
        """Before a call of ``session``, or its end: when the last stop kept one of its
        kernels and the start's re-adoption is still under way, wait for it (bounded by
        ``adopt_timeout_s``); a call of any other session never waits."""
        task = self._recovery
        if session is None or task is None or task.done() or not session.kernels_at_stop:
            return
        keepers = [b for b in self.backends.values() if isinstance(b, SessionKeeper)]
        for keeper in keepers:
            await within(keeper.adopted(session.id), self.settings.adopt_timeout_s)
        if any(session.id in k.adoption_failed for k in keepers):  # the recovery ends it
            await within(asyncio.shield(task), self.settings.adopt_timeout_s)

    async def _audit_recovery(self) -> None:
        """After start: audit each session the sweep did not re-adopt (``session_expired``,
        with why), end those whose kept container did not check out, and audit every
        recovered session (``session_recovered``: its live kernels, and those lost)."""
        for session, why in self.sessions.refused.values():
            await self._audit_quietly("session_expired", session, reason=why)
        self.sessions.refused.clear()
        for name, backend in self.backends.items():
            if not isinstance(backend, SessionKeeper):
                continue
            failed = backend.adoption_failed
            for ended in [s for s in self.sessions.registered() if s.id in failed]:
                await self.end_session(ended, "session_expired",
                                       reason=f"{name}: {failed[ended.id]}")
            backend.adoption_failed = {}
        for session in self.sessions.registered():
            live = self.kernel_backends(session.id)
            await self._audit_quietly(
                "session_recovered", session, kernels=live,
                kernels_lost=[b for b in session.kernels_at_stop if b not in live])

    async def _audit_quietly(self, event: str, session: Session, **fields: Any) -> None:
        try:
            await self.recorder.record(self.audit.write, event=event, client=session.client,
                                       session=session.id, **fields)
        except AuditFailure as exc:
            log.error("session %s: no %s audit record: %s", session.id, event, exc)

    def restart_lost(self, session: Session | None, backend: str | None) -> bool:
        """Whether the session's kernel on ``backend`` was live at the last stop and is not
        now (the restart ended it)."""
        return (session is not None and backend is not None
                and backend in session.kernels_at_stop
                and backend not in self.kernel_backends(session.id))

    def note_restart(self, session: Session | None, backend: str | None, lost: bool,
                     result: Result) -> Result:
        """After a session call: once a python call reached the kernel on ``backend``, the
        restart is said (``lost``: :func:`note_restart`) and forgotten."""
        if (session is None or backend is None or result.kernel is None
                or backend not in session.kernels_at_stop):
            return result
        session.kernels_at_stop = [b for b in session.kernels_at_stop if b != backend]
        with contextlib.suppress(OSError):
            self.sessions.save(session)
        return note_restart(result) if lost else result
