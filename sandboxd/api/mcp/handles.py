"""State handles of the stateless MCP revision (2026-07-28, SEP-2567): no MCP session keeps a
workspace there, so the server mints one and the model threads it through its calls.

A stateless ``tools/call`` that names no session runs in a new sandboxd session (workspace and
Python kernel) made for its caller; the result names it (``structuredContent.session`` and a
last text block), and every tool listed at that revision takes an optional ``session``
argument that the model passes back to keep its files and variables. A host needs to know
nothing of sandboxd: the handle is an ordinary tool argument.

The sessions are ordinary sandboxd sessions: the caller's (another client's id is refused
like any session id), idle-expired after ``session_ttl_s``, deleted with ``DELETE
/v1/sessions/{id}``. What they add is a per-client bound: a client holds at most
``mcp_max_sessions_per_client`` minted sessions (the cap of its handshake-era MCP sessions),
and a mint past it, or past the client's ``max_sessions_per_client``, first ends its least
recently used minted session that runs no call (audited ``session_deleted`` with the reason).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

from sandboxd.errors import UnknownTool
from sandboxd.models import ToolSpec
from sandboxd.service import Sandboxd
from sandboxd.sessions.manager import Session, SessionError, SessionLimitReached, SessionNotFound
from sandboxd.tools import ArgumentsInvalid, validate_arguments
from sandboxd.util.reservations import Cap, CapReached, Ledger

#: the tool argument that carries the handle (a tool whose own parameters declare it keeps
#: its own, and gets no handle: its stateless calls run one-shot)
ARGUMENT = "session"
PROPERTY: dict[str, Any] = {
    "type": "string",
    "description": (
        "The sandboxd session to run in: the session id a previous result named. Pass it to "
        "keep that call's files and Python variables; leave it out to start a new session."),
}
EVICTED = "the client minted more MCP sessions than mcp_max_sessions_per_client; this was " \
          "its least recently used"


class HandleLimit(SessionLimitReached):
    """Every minted session of the client runs a call: none can make room for another."""


def _ended(sid: str) -> SessionNotFound:
    """A session evicted a moment ago: to its caller, as any ended session."""
    return SessionNotFound(f"session '{sid}' does not exist or has expired")


def takes_handle(schema: dict[str, Any]) -> bool:
    """Whether a tool with this parameter schema gets the ``session`` argument."""
    return ARGUMENT not in (schema.get("properties") or {})


def with_handle(schema: dict[str, Any]) -> dict[str, Any]:
    """The tool's input schema as the stateless revision lists it: with ``session``."""
    if not takes_handle(schema):
        return schema
    return {**schema, "properties": {**(schema.get("properties") or {}), ARGUMENT: PROPERTY}}


def take_handle(tool: str, arguments: dict[str, Any]) -> str | None:
    """Remove ``session`` from ``arguments`` (the tool's own schema never sees it) and return
    it; a value that is no session id is the tool's bad argument."""
    sid = arguments.pop(ARGUMENT, None)
    if sid is not None and (not isinstance(sid, str) or not sid):
        raise ArgumentsInvalid(tool, ARGUMENT, "must be a session id (a string a previous "
                               "result named)")
    return sid


def note(sid: str) -> str:
    """The text a model reads after a stateless call: the session to pass back."""
    return (f"[session {sid}: pass \"{ARGUMENT}\": \"{sid}\" in your next call to keep this "
            "call's files and Python variables]")


class Handles:
    """The sessions minted for stateless calls, per client, and the calls running in them."""

    def __init__(self, service: Sandboxd, per_client: int) -> None:
        self.service = service
        self.per_client = per_client
        self._minted: dict[str, set[str]] = {}  # client -> ids of its minted sessions
        self._minting: Ledger[str] = Ledger()  # client -> mints not yet done
        self._busy: Counter[str] = Counter()  # session id -> its MCP calls running now
        self._ending: set[str] = set()  # evicted, being ended: no call may start in them

    def _live(self, client: str) -> list[Session]:
        """The client's minted sessions still alive (ended ones are forgotten here)."""
        ids = self._minted.get(client, set())
        live = []
        for sid in list(ids):
            try:
                live.append(self.service.session(client, sid))
            except SessionError:
                ids.discard(sid)
        if not ids:
            self._minted.pop(client, None)
        return live

    async def mint(self, client: str) -> str:
        """A new session for ``client``, after ending its least recently used idle minted
        sessions while it is at a cap. The room is taken before the first ``await``, so that
        concurrent mints cannot overshoot."""
        live = self._live(client)
        pending = self._minting.held(client)
        victims = self._victims(client, live, pending)
        try:  # the room, taken before the first await (sandboxd.util.reservations)
            place = self._minting.reserve(client, Cap(
                "mcp_max_sessions_per_client", len(live) - len(victims) + pending,
                self.per_client))
        except CapReached:
            raise HandleLimit(
                f"client '{client}' has {len(live) + pending} MCP sessions running calls, the "
                f"limit (setting mcp_max_sessions_per_client = {self.per_client}); pass one "
                f"of them as \"{ARGUMENT}\" or wait for a call to end") from None
        for victim in victims:
            self._minted.get(client, set()).discard(victim.id)
            self._ending.add(victim.id)
        try:
            await self._evict(victims)
            session = await self.service.create_session(client, None, transport="mcp")
        finally:
            place.release()
        self._minted.setdefault(client, set()).add(session.id)
        return session.id

    def _victims(self, client: str, live: list[Session], pending: int) -> list[Session]:
        """The least recently used idle minted sessions to end so that one more session
        fits under both caps: MCP's per client (``live`` and ``pending`` mints) and the
        service's."""
        idle = sorted((s for s in live if not self._busy[s.id]), key=lambda s: s.expires_at)
        native = len(self.service.sessions.owned(client))
        native_cap = self.service.sessions.max_per_client
        victims: list[Session] = []
        while idle and (len(live) - len(victims) + pending >= self.per_client
                        or native - len(victims) + pending >= native_cap):
            victims.append(idle.pop(0))
        return victims

    async def _evict(self, victims: list[Session]) -> None:
        """End the evicted sessions, each no longer marked as ending once its end is done."""
        for victim in victims:
            try:
                await self.service.end_session(victim, "session_deleted", transport="mcp",
                                               reason=EVICTED)
            finally:
                self._ending.discard(victim.id)

    async def session_for(self, client: str, tool: str, arguments: dict[str, Any],
                          meta_session: str | None) -> str | None:
        """The session a stateless call runs in: the one its ``session`` argument (or
        ``_meta``) names, which must be the caller's and alive (else nothing runs), or a new
        one minted for it. The tool and the arguments are checked first: a call that cannot
        run mints nothing. Takes ``session`` out of ``arguments``."""
        spec = self._spec(client, tool)
        if not takes_handle(spec.parameters):
            return meta_session  # the tool's own argument is called "session"
        sid = take_handle(tool, arguments) or meta_session
        validate_arguments(tool, spec.parameters, arguments)
        if sid is not None:
            return self._named(client, sid)
        if not spec.available:
            return None  # the service refuses it: no session for a call that cannot run
        return await self.mint(client)

    def _spec(self, client: str, tool: str) -> ToolSpec:
        """The client's tool named ``tool`` (:class:`UnknownTool` lists the ones it has)."""
        specs = self.service.tools(client)
        spec = next((s for s in specs if s.name == tool), None)
        if spec is None:
            raise UnknownTool(tool, sorted(s.name for s in specs))
        return spec

    def _named(self, client: str, sid: str) -> str:
        """The session a call names, when it is the caller's, alive and not being evicted
        (else :class:`SessionNotFound`, which says to leave it out)."""
        try:
            if sid in self._ending:
                raise _ended(sid)
            self.service.session(client, sid)
        except SessionNotFound as exc:
            raise SessionNotFound(f"{exc}; leave out \"{ARGUMENT}\" to start a new "
                                  "session") from None
        return sid

    @contextlib.contextmanager
    def use(self, sid: str) -> Iterator[None]:
        """A call runs in session ``sid``: it is not evicted meanwhile."""
        if sid in self._ending:
            raise _ended(sid)
        self._busy[sid] += 1
        try:
            yield
        finally:
            self._busy[sid] -= 1
            if self._busy[sid] <= 0:
                del self._busy[sid]
