"""Session kernels (persistent Python state per session) seen from the service: the host-wide
cap on live kernels, and the session operations of :class:`~sandboxd.service.Sandboxd`
(:class:`SessionService`: create, list, describe, restart, delete, expire).

A *kernel* is a session's persistent Python interpreter on one backend; the backends that keep
them own them (:class:`~sandboxd.backends.capabilities.KernelHost`). The service only counts them:
a session ``python`` call whose session has no live kernel on its backend would start one, so
it is admitted only while the live kernels of every backend, plus the kernels reserved by
calls in flight, stay under ``max_kernels`` (:class:`KernelCap`), reserved before the call's
first ``await`` as :mod:`sandboxd.util.reservations` reserves every cap, so concurrent calls can
never overshoot it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sandboxd.backends.base import Backend, kernel_name
from sandboxd.backends.capabilities import (
    KernelHost,
    hibernated_kernels,
    kernel_backends,
    kernel_count,
    kernel_host,
    kernel_names,
    live_kernels,
    pausable,
)
from sandboxd.errors import (
    AuditFailure,
    Draining,
    ExecutionFailure,
    KernelLimitReached,
    StorageUnavailable,
)
from sandboxd.host.storage import is_no_space
from sandboxd.sessions.manager import SessionNotFound
from sandboxd.sessions.ready import Ready, ReadySessions
from sandboxd.util.reservations import Cap, CapReached, Ledger, Reservation

if TYPE_CHECKING:
    from sandboxd.config import Settings
    from sandboxd.sessions.manager import Session, SessionManager

log = logging.getLogger("sandboxd")


class Gate(Protocol):
    """What the session operations ask of the service's health (:class:`sandboxd.health.
    state.Health`, a floor above): whether it drains, and whether its state directory has
    room."""

    draining: bool

    def check_state_dir(self) -> None: ...

#: one live kernel: (backend name, session id)
KernelKey = tuple[str, str]


class _NoKernel:
    """The ticket of a call that needs no kernel: reserves nothing."""

    def release(self) -> None:
        return None


#: a kernel reserved for one call in flight (a :class:`~sandboxd.util.reservations.Reservation`
#: of its :data:`KernelKey`); ``release()`` it when the call is over (the backend's own
#: count has taken over, if the kernel lives)
KernelTicket = Reservation[KernelKey] | _NoKernel


class KernelCap:
    """The host-wide limit on live session kernels (``max_kernels``), every backend together
    (reserved as :mod:`sandboxd.util.reservations` reserves every cap)."""

    def __init__(self, limit: int, backends: Mapping[str, Backend]) -> None:
        self.limit = limit
        self.backends = backends
        self._reserved: Ledger[KernelKey] = Ledger()
        #: called with the number of kernels being started by calls in flight before one
        #: more is admitted; raises to refuse it (the memory headroom: sandboxd.capacity)
        self.gate: Callable[[int], None] = lambda starting: None

    def live(self) -> set[KernelKey]:
        """Kernels alive on the backends now, and those reserved by calls in flight."""
        return self._on_backends() | self._reserved.keys()

    def _on_backends(self) -> set[KernelKey]:
        """Kernels alive in memory on the backends now (one per session and language; a
        hibernated one holds none: waking it is admitted as a new one)."""
        return {(kernel_name(name, language), sid) for name, backend in self.backends.items()
                for sid, language in live_kernels(backend, resident=True)}

    def _resident(self, key: KernelKey) -> bool:
        """``key in self._on_backends()``, in one look at the session's kernels."""
        kernel, sid = key
        return kernel in kernel_names(self.backends, sid, resident=True)

    def count(self) -> int:
        """``len(self.live())``, without building it (the reserved kernels are few; the
        backends' are counted)."""
        return (sum(kernel_count(b, resident=True) for b in self.backends.values())
                + len(self._starting()))

    def _starting(self) -> list[KernelKey]:
        """The kernels being started by calls in flight (reserved, not on a backend yet)."""
        reserved = self._reserved.keys()  # (a copy: few)
        return [key for key in reserved if not self._resident(key)]

    def hibernated(self) -> int:
        """How many kernels sleep on disk now (they hold no memory)."""
        return hibernated_kernels(self.backends)

    def admit(self, session_id: str | None, kernel: str | None, *,
              python: bool) -> KernelTicket:
        """Reserve the kernel a call needs (``kernel``: its name,
        :func:`~sandboxd.backends.base.kernel_name`), or raise :class:`KernelLimitReached`.
        Calls without a session, or that run in no kernel (``python`` false), need none."""
        if session_id is None or kernel is None or not python:
            return _NoKernel()
        key = (kernel, session_id)
        # one look at this session's kernels and a count of the others': no scan of every
        # live kernel, which a host with thousands of sessions would pay on every call
        if self._reserved.held(key) or self._resident(key):  # counted already: shared
            return self._reserved.reserve(key)
        live = self.count()
        try:
            cap = Cap("max_kernels", live, self.limit)
            if cap.count < cap.limit:  # room under the cap: is there room in memory?
                self.gate(len(self._starting()))
            return self._reserved.reserve(key, cap)
        except CapReached:
            raise KernelLimitReached(
                f"this call needs a new session kernel ({kernel}) for session "
                f"'{session_id}', but the host already runs {live} session kernels "
                "(a session's python and bash kernels count one each), its limit "
                f"(max_kernels = {self.limit}); retry later, delete sessions that are no "
                "longer needed, or run the code without a session") from None


#: write one audit record (``event=``, ``client=``, ...) through the service's recorder
Record = Callable[..., Awaitable[None]]


class SessionService:
    """The session operations of the service (create, list, describe, restart, interrupt,
    delete, end, revoke). ``health`` refuses work while draining or out of room;
    ``note_kernels`` writes which kernels a session has live now
    (:meth:`~sandboxd.sessions.restarts.Restarts.note_kernels`)."""

    def __init__(self, settings: Settings, sessions: SessionManager,
                 backends: Mapping[str, Backend], health: Gate, record: Record,
                 note_kernels: Callable[[Session | None], None]) -> None:
        self.settings = settings
        self.sessions = sessions
        self.backends = backends
        self.health = health
        self.record = record
        self.note_kernels = note_kernels
        #: sessions made ahead with their sandbox started (the service fills it)
        self.ready: list[ReadySessions] = []
        #: the ends of sessions under way (each runs to its end, :meth:`end_session`)
        self._endings: set[asyncio.Future[dict[str, Any]]] = set()
        #: refuses a new session while the host has no room (sandboxd.capacity: memory
        #: headroom), before the first await; the service sets it
        self.admit_session: Callable[[], None] = lambda: None

    def kernel_backends(self, session_id: str) -> list[str]:
        """Names of the backends on which the session has a live kernel now."""
        return kernel_backends(self.backends, session_id)

    def _kernel_hosts(self) -> list[tuple[str, KernelHost]]:
        """``(name, backend)`` of the backends that keep session kernels."""
        return [(name, host) for name, backend in self.backends.items()
                if (host := kernel_host(backend)) is not None]

    async def session_view(self, session: Session) -> dict[str, Any]:
        """The session as the API shows it: usage and kernel state included."""
        usage = await self.sessions.usage(Path(session.workspace))
        paused = any(session.id in sandbox.paused_sessions() for b in self.backends.values()
                     if (sandbox := pausable(b)) is not None)
        return session.public(usage, self.kernel_backends(session.id), paused)

    async def list_sessions(self, client: str) -> list[dict[str, Any]]:
        """The client's live sessions, oldest first (another client's are never listed)."""
        owned = sorted(self.sessions.owned(client), key=lambda s: s.created_at)
        return list(await asyncio.gather(*(self.session_view(s) for s in owned)))

    async def create_session(self, client: str, ttl_s: float | None, *,
                             transport: str = "http") -> Session:
        """A new session with its own workspace (audited). A draining daemon makes none: the
        session would end with it (a fleet's proxy places it on another node: 503)."""
        if self.health.draining:
            raise Draining("the daemon is shutting down; create the session on another "
                           "instance or later")
        self.health.check_state_dir()
        self.admit_session()  # memory headroom, before the first await
        (place,) = self.sessions.reserve_places(client)
        ready = self._ready_for(client)
        try:
            session = await self.sessions.create(client, ttl_s, place=place,
                                                 ready=ready[1].made if ready else None)
        except BaseException as exc:
            if ready is not None:  # (create undid its workspace and uid)
                await ready[0].discard(ready[1], workspace=False)
            if isinstance(exc, OSError) and is_no_space(exc):
                raise StorageUnavailable(f"no session can be created: the state directory is "
                                         f"full ({exc.strerror or exc})") from exc
            raise
        try:
            await self.record(event="session_created", client=client, session=session.id,
                              transport=transport)
        except AuditFailure:
            await self.sessions.drop(session)
            if ready is not None:
                await ready[0].discard(ready[1], workspace=False)
            raise
        if ready is not None:
            ready[0].claim(ready[1], client)  # its first call finds its sandbox started
        return session

    def _ready_for(self, client: str) -> tuple[ReadySessions, Ready] | None:
        """A ready session for a new session of ``client`` (:mod:`sandboxd.sessions.ready`),
        with the pool it came from; None when none serves it."""
        for pool in self.ready:
            taken = pool.take(client)
            if taken is not None:
                return pool, taken
        return None

    async def restart_session(self, client: str, session_id: str, *,
                              transport: str = "http") -> dict[str, Any]:
        """End the session's kernels on every backend (the next ``python`` call starts a
        fresh one; the workspace stays); audited as ``kernel_restart``. The session view,
        with ``restarted``: the backends whose kernel was ended."""
        session = self.sessions.get(session_id, client)
        restarted = []
        with self.sessions.in_use(session):  # it does not expire under the restart
            for name, host in self._kernel_hosts():
                try:
                    if await host.restart_kernel(session.id):
                        restarted.append(name)
                except Exception as exc:
                    log.exception("backend %s failed to restart the kernel of %s", name,
                                  session.id)
                    raise ExecutionFailure(f"the {name} backend could not restart the "
                                           f"session's kernel: {exc}") from exc
                finally:
                    self.note_kernels(session)  # ended cleanly: no crash reports it lost
        try:  # the kernels are gone either way: say so, and keep the failure in the log
            await self.record(event="kernel_restart", client=client, session=session.id,
                              backends=restarted, transport=transport)
        except AuditFailure as exc:
            log.error("session %s: kernel restarted without an audit record: %s",
                      session.id, exc)
        return {**await self.session_view(session), "restarted": restarted}

    async def interrupt_session(self, client: str, session_id: str, *,
                                transport: str = "http") -> dict[str, Any]:
        """Interrupt the ``python`` call that runs in the session now (so that a runaway
        call need not cost the session its state): its code
        gets a ``KeyboardInterrupt``, the call ends ``killed`` (``cancelled``) with its own
        result, and the kernel keeps its variables when it comes back within the grace.
        Audited as ``kernel_interrupt``. The session view, with ``interrupted``: the backends
        whose call was interrupted (none when no call was running)."""
        session = self.sessions.get(session_id, client)
        interrupted = [name for name, host in self._kernel_hosts()
                       if host.interrupt_kernel(session.id)]
        try:
            await self.record(event="kernel_interrupt", client=client, session=session.id,
                              backends=interrupted, transport=transport)
        except AuditFailure as exc:
            log.error("session %s: interrupt without an audit record: %s", session.id, exc)
        return {**await self.session_view(session), "interrupted": interrupted}

    async def pause_session(self, client: str, session_id: str, *,
                            transport: str = "http") -> dict[str, Any]:
        """Pause the session's sandbox now, by the backends' own idle pause (a container's
        processes get no CPU, its kernel keeps its state; never while a call runs in it);
        its next call, or :meth:`resume_session`, thaws it. Audited as ``session_paused``.
        The session view, with ``paused_on``: the backends whose sandbox is paused (none: a
        backend without a container, or none started yet, or a call running)."""
        return await self._freeze(client, session_id, "session_paused", transport, True)

    async def resume_session(self, client: str, session_id: str, *,
                             transport: str = "http") -> dict[str, Any]:
        """Thaw the session's paused sandbox (as its next call would); audited as
        ``session_resumed``. The session view, with ``resumed_on``: the backends thawed."""
        return await self._freeze(client, session_id, "session_resumed", transport, False)

    async def _freeze(self, client: str, session_id: str, event: str, transport: str,
                      pause: bool) -> dict[str, Any]:
        session = self.sessions.get(session_id, client)
        done = []
        with self.sessions.in_use(session):  # it does not expire meanwhile
            for name, backend in self.backends.items():
                if (sandbox := pausable(backend)) is None:
                    continue  # nothing kept running between its calls: nothing to pause
                try:
                    if await (sandbox.pause_session(session.id) if pause
                              else sandbox.resume_session(session.id)):
                        done.append(name)
                except Exception as exc:
                    log.exception("backend %s failed to %s session %s", name,
                                  "pause" if pause else "resume", session.id)
                    raise ExecutionFailure(f"the {name} backend could not "
                                           f"{'pause' if pause else 'resume'} the session's "
                                           f"sandbox: {exc}") from exc
        try:
            await self.record(event=event, client=client, session=session.id, backends=done,
                              transport=transport)
        except AuditFailure as exc:
            log.error("session %s: %s without an audit record: %s", session.id, event, exc)
        key = "paused_on" if pause else "resumed_on"
        return {**await self.session_view(session), key: done}

    async def delete_session(self, client: str, session_id: str, *,
                             transport: str = "http") -> None:
        """Delete a session: its kernels, anything a backend kept, its workspace (audited)."""
        session = self.sessions.get(session_id, client)
        if await self.end_session(session, "session_deleted", transport=transport) is None:
            raise SessionNotFound(f"session '{session_id}' does not exist or has expired")

    async def end_session(self, session: Session, event: str | None,
                          **fields: Any) -> dict[str, Any] | None:
        """The one way a session ends (DELETE, TTL expiry, daemon stop, client revoked):
        unregistered first (no new call finds it), then its calls cancelled and waited for
        (:mod:`sandboxd.sessions.calls`), then its kernels and containers on every backend,
        then its workspace (unmounted, removed) and uid, then the ``event`` audit record
        with ``fields`` (none when the caller audits the whole, as a revocation does).
        What was ended: ``{"id", "kernels": the backends whose kernel was live, "verified":
        no kernel is left and the workspace is gone}``; None when it had ended already."""
        if not self.sessions.forget(session):
            return None
        # the rest runs to its end even when the caller is cancelled (a DELETE whose client
        # hung up): an unregistered session is found by nothing else that would end it
        ending = asyncio.ensure_future(self._end_forgotten(session, event, fields))
        self._endings.add(ending)
        ending.add_done_callback(self._endings.discard)
        return await asyncio.shield(ending)

    async def _end_forgotten(self, session: Session, event: str | None,
                             fields: dict[str, Any]) -> dict[str, Any]:
        """:meth:`end_session` after the session was unregistered."""
        kernels = self.kernel_backends(session.id)
        # its calls first (cancelled, their sandboxes ended and verified): nothing of it may
        # run once its workspace and uid are free (sandboxd.sessions.calls)
        await self.sessions.end_calls(session)
        await self._close_session_backends(session)
        removed = await self.sessions.remove(session)
        left = self.kernel_backends(session.id)
        if left:
            log.error("session %s ended, but its kernel on %s is still alive", session.id, left)
        if event is not None:
            try:  # the session is gone either way: say so, and keep the failure in the log
                await self.record(event=event, client=session.client, session=session.id,
                                  **fields)
            except AuditFailure as exc:
                log.error("session %s ended without an audit record: %s", session.id, exc)
        return {"id": session.id, "kernels": kernels, "verified": removed and not left}

    async def expire_session(self, session: Session) -> None:
        """A session whose time is up (the expiry loop)."""
        await self.end_session(session, "session_expired")

    async def end_at_stop(self, session: Session) -> None:
        """A session the daemon's stop ends (its workspace was in memory)."""
        await self.end_session(session, "session_expired",
                               reason="the daemon stopped (its workspace was in memory)")

    async def revoke_client(self, client: str, reason: str, *,
                            mcp_sessions: Sequence[str] = ()) -> dict[str, Any]:
        """End everything of a client that has no valid token left: every session (kernels,
        containers, workspace) through :meth:`end_session`. Audited as one
        ``client_revoked`` record (``reason``, ``sessions`` ended, ``mcp_sessions`` the MCP
        front door ended, ``verified``); returns its fields."""
        ended = [e for s in self.sessions.registered(client)
                 if (e := await self.end_session(s, None)) is not None]
        fields: dict[str, Any] = {
            "reason": reason, "sessions": ended, "mcp_sessions": list(mcp_sessions),
            "verified": all(e["verified"] for e in ended)}
        try:
            await self.record(event="client_revoked", client=client, **fields)
        except AuditFailure as exc:
            log.error("client %s revoked without an audit record: %s; %s", client, exc, fields)
        return fields

    async def _close_session_backends(self, session: Session) -> None:
        for backend in self.backends.values():
            with contextlib.suppress(Exception):
                await backend.close_session(session.id)
