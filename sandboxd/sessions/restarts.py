"""Restarts keep sessions (an upgrade must not end users' work): what a restarted daemon checks
before it re-adopts a session, and what a session's next call is told about a kernel the restart
ended.

A clean stop with ``sessions_survive_restart`` (the default) ends no session: a tmpfs workspace
stays mounted (the mounts are the host's: a test daemon's namespace, or the unit's with
``sandboxd-quota.conf``, whose ``PrivateMounts=no`` propagates them to the host), and session
containers keep running with their kernels (:mod:`sandboxd.backends.container.adopt`). The
next start re-adopts a session only when its workspace checks out here: a real directory owned
by its sandbox uid and, with kernel quotas, the sandboxd tmpfs itself (type, source,
``nosuid,nodev``), never something mounted or planted in its place while no daemon watched.

A crash never hides a lost kernel: which kernels of a session live is kept in its metadata
file (named by backend, and by language when that is not python: ``container``,
``container:bash``; a session's python and bash state are kept or lost each on its own), in
``kernels_live``, written atomically when a call leaves a kernel started or ended, cleared
when a clean stop moves it to ``kernels_at_stop``. What a start still finds there was live
when the previous daemon died without stopping: unless the kernel is alive again (adopted),
it is lost with reason ``daemon_crash``; one a clean stop noted is lost with
``daemon_restart``. Either is audited in ``session_recovered`` and said once, by the session's
next call that reaches that kernel (in that language's words: :data:`LOST_STATE`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandboxd.backends.base import PYTHON, kernel_fields, kernel_name
from sandboxd.backends.capabilities import kernel_names, session_keeper
from sandboxd.errors import AuditFailure
from sandboxd.models import Kernel, Result
from sandboxd.protocol.plan import KERNEL_KINDS, ToolKind
from sandboxd.util.deadline import within
from sandboxd.workspaces.quota import FS_SOURCE, unescape_mountinfo

if TYPE_CHECKING:
    from sandboxd.backends.base import Backend
    from sandboxd.backends.capabilities import SessionKeeper
    from sandboxd.config import Settings
    from sandboxd.sessions.manager import Session, SessionManager

log = logging.getLogger("sandboxd")

#: ``kernel.reason`` of the first kernel call after a clean stop ended the session's kernel
DAEMON_RESTART = "daemon_restart"
#: ``kernel.reason`` of the first kernel call after a crash (``SIGKILL``, OOM) ended it
DAEMON_CRASH = "daemon_crash"
#: what a restart cost a language's kernel, and what the call ran in instead, in the model's
#: words (one entry per session language)
LOST_STATE = {
    "python": ("Python state (variables, imports)", "a fresh interpreter"),
    "bash": ("Bash state (working directory, variables, functions, aliases)", "a fresh shell"),
    "javascript": ("JavaScript state (globals, functions, required modules)", "a fresh node"),
    "typescript": ("JavaScript state (globals, functions, required modules)", "a fresh node"),
}
_SINCE = {DAEMON_RESTART: "the daemon restarted",
          DAEMON_CRASH: "the daemon crashed and restarted"}


def lost_message(reason: str, language: str = PYTHON) -> str:
    """What the model reads when a restart (``reason``) ended the session's ``language``
    kernel (the files are kept; the state is not)."""
    state, fresh = LOST_STATE[language]
    return (f"{_SINCE[reason]} since this session's last call: its {state} was lost and this "
            f"call ran in {fresh}; the workspace files are kept")


RESTART_MESSAGE = lost_message(DAEMON_RESTART)
CRASH_MESSAGE = lost_message(DAEMON_CRASH)


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


def kernel_of(backend: str | None, kind: ToolKind) -> str | None:
    """The name of the session kernel a call of ``kind`` on ``backend`` runs in (None: it
    runs in none)."""
    return kernel_name(backend, kind.value) if backend and kind in KERNEL_KINDS else None


def note_restart(result: Result, reason: str = DAEMON_RESTART, language: str = PYTHON) -> Result:
    """A session kernel call's result whose ``language`` kernel the last restart ended:
    ``kernel.lost`` with ``reason`` (``daemon_restart`` or ``daemon_crash``; the call itself
    ran in a fresh kernel)."""
    if result.kernel is None:
        return result
    kernel: Kernel = result.kernel
    if kernel.lost:
        return result  # this call lost its new kernel too: that reason says more
    message = "; ".join(m for m in (result.message, lost_message(reason, language)) if m)
    return result.model_copy(update={
        "kernel": kernel.model_copy(update={"lost": True, "reason": reason}),
        "message": message})


#: write one audit record (``event=``, ``client=``, ...) through the service's recorder
Record = Callable[..., Awaitable[None]]
#: the one way a session ends (:meth:`~sandboxd.sessions.kernels.SessionService.end_session`)
EndSession = Callable[..., Awaitable[dict[str, Any] | None]]


class Restarts:
    """What the service does about restarts: keep sessions at a clean stop, audit the
    recovery at start, tell a session's next kernel call that its kernel was lost."""

    def __init__(self, settings: Settings, sessions: SessionManager,
                 backends: Mapping[str, Backend], record: Record) -> None:
        self.settings = settings
        self.sessions = sessions
        self.backends = backends
        self.record = record
        #: the start's re-adoption and its audit, while the daemon serves (:meth:`_recover`)
        self.recovery: asyncio.Task[None] | None = None

    def kernel_names(self, session_id: str) -> list[str]:
        """Names of the session's live kernels now (a backend's, and its language's when
        that is not python: :func:`~sandboxd.backends.base.kernel_name`)."""
        return kernel_names(self.backends, session_id)

    @property
    def recovering(self) -> bool:
        """The start's re-adoption (or its audit) is still under way."""
        return self.recovery is not None and not self.recovery.done()

    def expect_recovered(self) -> None:
        """Before the backends start: tell the keepers which sessions the sweep recovered."""
        self._note_crashes()
        expected = {s.id: (s.client, s.workspace, s.uid) for s in self.sessions.registered()}
        for backend in self.backends.values():
            if (keeper := session_keeper(backend)) is not None:
                keeper.expect_sessions(expected)

    def note_kernel_starting(self, session: Session | None, kernel: str | None) -> None:
        """As a session kernel call reaches its ``kernel`` (a name of
        :func:`~sandboxd.backends.base.kernel_name`; it may start the kernel): it is listed
        live ahead, so that a crash during the call that starts it does not
        hide it; :meth:`note_kernels` corrects the list once the call is over."""
        if (session is None or kernel is None or kernel in session.kernels_live
                or not self.sessions.holds(session)):
            return
        session.kernels_live = sorted({*session.kernels_live, kernel})
        try:
            self.sessions.save(session)
        except OSError as exc:
            log.warning("session %s: live kernels not saved: %s", session.id, exc)

    def note_kernels(self, session: Session | None) -> None:
        """After a session call (or a kernel restart): its file's ``kernels_live`` says which
        kernels live now, written (atomically) only when that changed and only while the
        session is registered. A file that cannot be written is logged: the next call tries
        again."""
        if session is None or not self.sessions.holds(session):
            return
        live = self.kernel_names(session.id)
        if live == session.kernels_live:
            return
        session.kernels_live = live
        try:
            self.sessions.save(session)
        except OSError as exc:
            log.warning("session %s: live kernels not saved: %s", session.id, exc)

    def note_stop(self) -> None:
        """Any clean stop: each session the stop leaves lists its live kernels under
        ``kernels_at_stop`` (restricted ones die with the daemon; a kept container's may be
        adopted), and ``kernels_live`` is cleared: the next start reads ``daemon_restart``,
        never ``daemon_crash``, for them."""
        for session in self.sessions.registered():
            # (a kernel lost at an earlier restart and not yet reported stays listed)
            at_stop = sorted(set(session.kernels_at_stop) | set(self.kernel_names(session.id)))
            if at_stop != session.kernels_at_stop or session.kernels_live:
                session.kernels_at_stop = at_stop
                session.kernels_live = []
                try:
                    self.sessions.save(session)
                except OSError as exc:
                    log.warning("session %s: kernels at stop not saved: %s", session.id, exc)

    async def keep_sessions(self) -> None:
        """Clean stop with ``sessions_survive_restart``, after :meth:`note_stop`: let the
        backends keep what they can."""
        registered = self.sessions.registered()
        ids = {s.id for s in registered}
        for name, backend in self.backends.items():
            if (keeper := session_keeper(backend)) is not None:
                try:
                    kept = await keeper.keep_sessions(ids)
                except Exception:
                    log.exception("backend %s could not keep its sessions", name)
                else:
                    log.info("backend %s kept %d session container(s)", name, len(kept))

    async def _recover(self, end_session: EndSession) -> None:
        """In the background after start: wait for the keepers' re-adoption (each bounds its
        own by ``adopt_timeout_s``), then audit the recovery."""
        for backend in self.backends.values():
            if (keeper := session_keeper(backend)) is not None:
                await keeper.adopted()
        await self._audit_recovery(end_session)

    async def start_recovery(self, end_session: EndSession) -> None:
        """At start: the recovery's audit now, or in the background while a keeper still
        re-adopts (the daemon serves meanwhile; :meth:`recovered`); ``end_session`` ends a
        session whose kept state did not check out."""
        self.recovery = asyncio.create_task(self._recover(end_session), name="session-recovery")
        if not any(k.adopting for k in self._keepers()):
            await asyncio.wait({self.recovery})

    def _keepers(self) -> list[SessionKeeper]:
        """The backends whose session state can outlive the daemon."""
        return [k for b in self.backends.values() if (k := session_keeper(b)) is not None]

    async def recovered(self, session: Session | None) -> None:
        """Before a call of ``session``, or its end: when the last stop kept one of its
        kernels and the start's re-adoption is still under way, wait for it (bounded by
        ``adopt_timeout_s``); a call of any other session never waits."""
        task = self.recovery
        if session is None or task is None or task.done() or not session.kernels_at_stop:
            return
        keepers = self._keepers()
        for keeper in keepers:
            await within(keeper.adopted(session.id), self.settings.adopt_timeout_s)
        if any(session.id in k.adoption_failed for k in keepers):  # the recovery ends it
            await within(asyncio.shield(task), self.settings.adopt_timeout_s)

    async def _audit_recovery(self, end_session: EndSession) -> None:
        """After start: audit each session the sweep did not re-adopt (``session_expired``,
        with why), end those whose kept container did not check out, and audit every
        recovered session (``session_recovered``: its live kernels, and those lost)."""
        for session, why in self.sessions.refused.values():
            await self._audit_quietly("session_expired", session, reason=why)
        self.sessions.refused.clear()
        for name, backend in self.backends.items():
            if (keeper := session_keeper(backend)) is None:
                continue
            failed = keeper.adoption_failed
            for ended in [s for s in self.sessions.registered() if s.id in failed]:
                await end_session(ended, "session_expired",
                                       reason=f"{name}: {failed[ended.id]}")
            keeper.adoption_failed = {}
        for session in self.sessions.registered():
            live = self.kernel_names(session.id)
            lost = [{**kernel_fields(k), "reason": r} for k in sorted(
                set(session.kernels_at_stop) | set(session.kernels_at_crash))
                if (r := self.restart_lost(session, k)) is not None]
            await self._audit_quietly("session_recovered", session, kernels=live,
                                      kernels_lost=lost)

    def _note_crashes(self) -> None:
        """At start, before anything runs: a kernel still listed live was live when the
        previous daemon died without a clean stop (a clean stop clears the list), so a crash
        ended it. Read here, not after the re-adoption round: calls served meanwhile list the
        kernels they start. A kept kernel that lives again is not reported
        (:meth:`restart_lost` asks the backends first)."""
        for session in self.sessions.registered():
            if not session.kernels_live:
                continue
            session.kernels_at_crash = sorted({*session.kernels_at_crash,
                                               *session.kernels_live})
            session.kernels_live = []
            try:
                self.sessions.save(session)
            except OSError as exc:  # said in the audit record either way; kept in memory
                log.warning("session %s: kernels lost in a crash not saved: %s", session.id,
                            exc)

    async def _audit_quietly(self, event: str, session: Session, **fields: Any) -> None:
        try:
            await self.record(event=event, client=session.client, session=session.id,
                              **fields)
        except AuditFailure as exc:
            log.error("session %s: no %s audit record: %s", session.id, event, exc)

    def restart_lost(self, session: Session | None, kernel: str | None) -> str | None:
        """Why the session's ``kernel`` (its name) is gone when a restart ended it (it was
        live at the last crash, ``daemon_crash``, or stop, ``daemon_restart``, and is not
        now); None when no restart did."""
        if (session is None or kernel is None
                or kernel in self.kernel_names(session.id)):
            return None
        if kernel in session.kernels_at_crash:
            return DAEMON_CRASH
        return DAEMON_RESTART if kernel in session.kernels_at_stop else None

    def forget_restart(self, session: Session | None, kernel: str | None, lost: str | None,
                       result: Result) -> str | None:
        """After a session call: once a kernel call reached its ``kernel``, the
        restart is forgotten; what its result must say (``lost``, the reason
        :meth:`restart_lost` gave before the call, for :func:`note_restart`), or None."""
        if (session is None or kernel is None or result.kernel is None
                or kernel not in {*session.kernels_at_stop, *session.kernels_at_crash}):
            return None
        session.kernels_at_stop = [b for b in session.kernels_at_stop if b != kernel]
        session.kernels_at_crash = [b for b in session.kernels_at_crash if b != kernel]
        with contextlib.suppress(OSError):
            self.sessions.save(session)
        return lost
