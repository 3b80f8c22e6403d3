"""Ready sessions: sessions made ahead of time, each with its sandbox already started, so that
a new session's first result does not wait for its sandbox to start.

A container session's first call starts its container (~100 ms of the engine's create and
start, then the runner's own start): most of a container session's create-to-first-result.
So the daemon keeps a few sessions *prepared* (:meth:`SessionManager.prepare
<sandboxd.sessions.manager.SessionManager.prepare>`: a session id, its own uid and its empty
workspace, registered to nobody) and asks the backend to start each one's sandbox on that
workspace with that uid, as the session's first call would. ``POST /v1/sessions`` for a
client whose ``python`` tool runs on that backend takes one: the session is registered with
that id, uid and workspace (its place under the client's cap is reserved as for any session,
and it is audited as any), and the backend files the sandbox under the client's session, where
its first call finds it. A sandbox that cannot serve the first call as its policy says (an
other image, a network, egress rules) is replaced at that call, as a lost one would be.

Nothing is shared: a ready session is a whole session made early, never given to two
clients; a taken one is replaced in the background. Sized by the backend
(``session_pool_size`` and the host's free memory); made only while some policy sends
``python`` to that backend in the sandbox a ready one holds (the backend's own image, no
network, no egress rules: :meth:`PolicyStore.runs_python_on
<sandboxd.policy.store.PolicyStore.runs_python_on>`), and taken only by such a client. A
ready session's uid comes from the sessions' share of the uid pool, as a session's does. A
stop removes them (sandbox, workspace, uid); after a crash the next start removes their
workspaces (no session file names them) and containers, as it removes any a crash leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from sandboxd.sessions.manager import Prepared, SessionManager
from sandboxd.util.deadline import stop_task, within

log = logging.getLogger("sandboxd.sessions.ready")

#: the longest wait between two failed preparations (doubling from :data:`RETRY_FIRST_S`)
RETRY_MAX_S = 30.0
RETRY_FIRST_S = 0.5
#: how often the ready sessions are looked at without a reason (an engine that came back)
RECHECK_S = 5.0


@runtime_checkable
class PrestartsSessions(Protocol):
    """A backend that can start a session's sandbox before the session has a client."""

    def ready_wanted(self) -> int:
        """How many ready sessions it wants now (0: none: off, unavailable, no room)."""

    async def prestart(self, session: str, uid: int | None, workspace: Path) -> object:
        """Start the sandbox of the prepared session ``session`` (its uid and workspace); a
        handle of it. Raises when it cannot (nothing of it is left then)."""

    def prestarted_usable(self, handle: object) -> bool:
        """Whether the sandbox of ``handle`` still works (its engine may have gone away)."""

    def claim(self, handle: object, client: str) -> None:
        """File the sandbox under ``client``'s session (its first call finds it)."""

    async def discard(self, handle: object) -> None:
        """Remove the sandbox of ``handle`` (never claimed); verified as any removal."""


@dataclass
class Ready:
    """One ready session: what the session manager prepared, and the backend's sandbox."""

    made: Prepared
    handle: object


class ReadySessions:
    """The ready sessions of one backend, and the task that keeps their number up."""

    def __init__(self, sessions: SessionManager, host: PrestartsSessions,
                 serves: Callable[[str | None], bool]) -> None:
        self.sessions = sessions
        self.host = host
        #: whether this client's sessions (None: some client's) can take one
        self.serves = serves
        self.queue: deque[Ready] = deque()
        self.refill = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._discards: set[asyncio.Future[None]] = set()  # removals under way

    def start(self) -> None:
        """Start keeping the number up."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="ready-sessions")
        self.refill.set()

    def wanted(self) -> int:
        """How many ready sessions there should be now."""
        try:
            return self.host.ready_wanted() if self.serves(None) else 0
        except Exception:  # a policy or host that cannot say: none
            log.exception("ready sessions: how many are wanted is not known")
            return 0

    def take(self, client: str) -> Ready | None:
        """A ready session for ``client``'s new session, or None (its sessions do not run on
        this backend, or none is ready). The caller registers it, then :meth:`claim`\\ s it
        or :meth:`discard`\\ s it."""
        if self._closing or not self.queue or not self.serves(client):
            return None
        while self.queue:
            ready = self.queue.popleft()
            self.refill.set()
            if self.host.prestarted_usable(ready.handle):
                return ready
            self._discard_soon(ready)
        return None

    def claim(self, ready: Ready, client: str) -> None:
        """The session of ``ready`` is ``client``'s now: its sandbox is filed under it."""
        self.host.claim(ready.handle, client)

    async def discard(self, ready: Ready, *, workspace: bool = True) -> None:
        """Remove the sandbox of ``ready`` (and, unless the session manager already did, its
        workspace and uid)."""
        try:
            await self.host.discard(ready.handle)
        finally:
            if workspace:
                await self.sessions.unprepare(ready.made)

    def _discard_soon(self, ready: Ready) -> None:
        task = asyncio.ensure_future(self.discard(ready))
        self._discards.add(task)
        task.add_done_callback(self._discards.discard)
        task.add_done_callback(_logged)

    async def close(self) -> None:
        """Stop refilling; remove every ready session (sandbox, workspace, uid)."""
        self._closing = True
        await stop_task(self._task)
        self._task = None
        while self.queue:
            with contextlib.suppress(Exception):
                await self.discard(self.queue.popleft())
        if self._discards:  # those under way end too
            await asyncio.gather(*self._discards, return_exceptions=True)

    async def _loop(self) -> None:
        delay = RETRY_FIRST_S
        while not self._closing:
            await within(self.refill.wait(), RECHECK_S)
            self.refill.clear()
            while not self._closing and len(self.queue) < self.wanted():
                try:
                    self.queue.append(await self._make())
                    delay = RETRY_FIRST_S
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("ready sessions: cannot prepare one: %s", exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_S)
            while len(self.queue) > self.wanted():  # no policy wants them any more, say
                self._discard_soon(self.queue.pop())
            if self.queue and not self._closing:
                # a sandbox that died meanwhile (its engine went away) is replaced
                dead = [r for r in self.queue if not self.host.prestarted_usable(r.handle)]
                for ready in dead:
                    self.queue.remove(ready)
                    self._discard_soon(ready)
                if dead:
                    self.refill.set()

    async def _make(self) -> Ready:
        made = await self.sessions.prepare()
        try:
            handle = await self.host.prestart(made.sid, made.uid, made.workspace)
        except BaseException:
            await asyncio.shield(self.sessions.unprepare(made))
            raise
        return Ready(made, handle)


def _logged(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("ready sessions: a removal failed: %s", task.exception())


class PolicyView(Protocol):
    """What ready sessions read of the policies (:class:`sandboxd.policy.store.PolicyStore`)."""

    def runs_python_on(self, backend: str, client: str | None = None) -> bool:
        """Whether ``client``'s ``python`` tool (None: some client's) runs on ``backend``."""


def ready_sessions(sessions: SessionManager, backends: Mapping[str, object],
                   policy: PolicyView) -> list[ReadySessions]:
    """The ready sessions of every backend that can start a session's sandbox ahead (its
    ``ready`` attribute), each made while some policy runs ``python`` on it."""
    made = []
    for name, backend in backends.items():
        host = getattr(backend, "ready", None)
        if isinstance(host, PrestartsSessions):
            made.append(ReadySessions(sessions, host,
                                      functools.partial(policy.runs_python_on, name)))
    return made
