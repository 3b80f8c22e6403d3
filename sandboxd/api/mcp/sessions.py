"""Bounds on MCP sessions, each of which holds memory (unbounded, one client could exhaust the
daemon's): a cap per client and in total, a short idle expiry for a session that never called a
tool, and a slot freed the moment its session ends.

A request without an ``Mcp-Session-Id`` may open a session: :meth:`SessionSlots.reserve` takes
a slot for it first, before any await (:mod:`sandboxd.util.reservations`: a flood of concurrent
``initialize`` requests cannot overshoot), or refuses with
:class:`McpSessionLimit` (HTTP 429 and a JSON-RPC error naming the setting). The SDK's session
manager (:class:`SessionManager`) binds the slot to the session it admits; the slot is freed
when the session is discarded (client ``DELETE``, idle expiry, crash, shutdown), or when the
request ends without opening one.

A session starts with the short idle timeout ``mcp_session_idle_s``; its first ``tools/call``
switches it to ``session_ttl_s`` (:meth:`SessionSlots.in_use`). An expired session's id is
answered 404 by the SDK, so a client initializes again.
"""

from __future__ import annotations

import contextvars
import logging
from dataclasses import dataclass
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.responses import JSONResponse
from starlette.types import Message, Send

from sandboxd.api import problems
from sandboxd.errors import SandboxdError
from sandboxd.util.reservations import Cap, CapReached, Ledger, Reservation

log = logging.getLogger("sandboxd.mcp")

PER_CLIENT = "mcp_max_sessions_per_client"
TOTAL = "mcp_max_sessions"


class McpSessionLimit(SandboxdError):
    """An ``initialize`` past an MCP session cap: refused, nothing was opened."""

    code = "too-many-mcp-sessions"

    def __init__(self, client: str, limit: str, value: int, idle_s: float) -> None:
        whose = f"client '{client}' has" if limit == PER_CLIENT else "the daemon has"
        super().__init__(
            f"{whose} {value} open MCP sessions, the limit (setting {limit} = {value}); end one "
            f"with DELETE /mcp, or wait for one that never called a tool to expire after "
            f"{idle_s:g} s idle (setting mcp_session_idle_s)")
        self.client = client
        self.limit = limit
        self.value = value

    def problem_fields(self) -> dict[str, Any]:
        return {"limit": self.limit, "limit_value": self.value}

    def response(self, ident: str | int | None) -> JSONResponse:
        """The answer to request ``ident``: the problem table's status, a JSON-RPC error body
        (what MCP clients read; the SDK client raises it from ``initialize``)."""
        status = problems.PROBLEMS[self.code][0]
        error = {"code": problems.MCP_ANSWERS[self.code].rpc, "message": str(self),
                 "data": {"client": self.client, **self.problem_fields()}}
        return JSONResponse({"jsonrpc": "2.0", "id": ident, "error": error}, status_code=status)


@dataclass
class Ticket:
    """A slot reserved by one request that may open a session."""

    client: str
    slot: Reservation[str]
    session_id: str | None = None  # set when the SDK admits a session on it


#: the ticket of the request being served (read by :meth:`SessionManager._admit_session`,
#: which runs in the request's own task)
TICKET: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("mcp_ticket", default=None)


class SessionSlots:
    """Who holds which MCP session slot: per-client and total counts, reservations included."""

    def __init__(self, *, per_client: int, total: int, idle_s: float, ttl_s: float,
                 on_change: Any = None) -> None:
        self.per_client = per_client
        self.total = total
        self.idle_s = min(idle_s, ttl_s)
        self.ttl_s = ttl_s
        self._slots: Ledger[str] = Ledger()  # by client: reservations and open sessions
        self._sessions: dict[str, tuple[Ticket, StreamableHTTPServerTransport]] = {}
        self._on_change = on_change or (lambda open_sessions: None)

    @property
    def open(self) -> int:
        """MCP sessions open now (reservations not counted)."""
        return len(self._sessions)

    def reserve(self, client: str) -> Ticket:
        """A slot for a request that may open a session, or :class:`McpSessionLimit`."""
        try:
            slot = self._slots.reserve(
                client, Cap(PER_CLIENT, self._slots.held(client), self.per_client),
                Cap(TOTAL, self._slots.total, self.total))
        except CapReached as exc:
            raise McpSessionLimit(client, exc.cap.name, exc.cap.limit, self.idle_s) from None
        return Ticket(client, slot)

    def settle(self, ticket: Ticket) -> None:
        """The request is done: a slot no session was admitted on is freed."""
        if ticket.session_id is None:
            ticket.slot.release()

    def admitted(self, ticket: Ticket, session_id: str,
                 transport: StreamableHTTPServerTransport) -> None:
        """The SDK admitted a session on this ticket: the slot is the session's now."""
        ticket.session_id = session_id
        self._sessions[session_id] = (ticket, transport)
        self._on_change(self.open)

    def ended(self, session_id: str) -> None:
        """The session was discarded (idempotent): its slot is free at once."""
        entry = self._sessions.pop(session_id, None)
        if entry is not None:
            entry[0].slot.release()
            self._on_change(self.open)

    def freeing(self, session_id: str, send: Send) -> Send:
        """``send`` of a ``DELETE``: the slot is free before the client reads the 200 (the
        SDK discards the session only after answering)."""

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 200:
                self.ended(session_id)
            await send(message)

        return wrapped

    def in_use(self, session_id: str | None) -> None:
        """The session called a tool: from now on it idles out after ``session_ttl_s``."""
        entry = self._sessions.get(session_id) if session_id else None
        if entry is not None:
            keep_for(entry[1], self.ttl_s)


def keep_for(transport: StreamableHTTPServerTransport, seconds: float) -> None:
    """Set the idle timeout of a live session. The SDK's transport reads ``_idle_timeout`` each
    time its last request in flight completes (mcp 2.3, the pinned range); fail loudly if a
    new SDK renamed it rather than keep every session for the short idle time."""
    if not hasattr(transport, "_idle_timeout"):  # pragma: no cover - an SDK change
        raise RuntimeError("the MCP SDK's transport has no _idle_timeout: check the pin")
    transport._idle_timeout = seconds


class SessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, telling :class:`SessionSlots` which session a slot holds
    and when it ends."""

    def __init__(self, app: Any, slots: SessionSlots, node_id: str = "") -> None:
        # the SDK's own total cap stays as a second line (503): ours counts reservations too,
        # so it refuses first
        super().__init__(app=app, session_idle_timeout=slots.idle_s, max_sessions=slots.total)
        self.slots = slots
        self.node_id = node_id  # session ids carry it: mcp_<node>_<the SDK's uuid4 hex>

    def _admit_session(self, requestor: AuthorizationContext | None
                       ) -> StreamableHTTPServerTransport | None:
        ticket = TICKET.get()
        if ticket is None or ticket.session_id is not None:  # never trust one check
            log.error("MCP session admission without a reserved slot: refused")
            return None
        transport = super()._admit_session(requestor)
        if transport is None or transport.mcp_session_id is None:
            return transport
        if self.node_id:
            self._rename(transport, f"mcp_{self.node_id}_{transport.mcp_session_id}")
        self.slots.admitted(ticket, transport.mcp_session_id, transport)
        return transport

    def _rename(self, transport: StreamableHTTPServerTransport, new: str) -> None:
        """Give a just-admitted session the id that names this node (a fleet's proxy routes
        ``Mcp-Session-Id`` by it); its randomness stays the SDK's."""
        old = transport.mcp_session_id
        assert old is not None
        transport.mcp_session_id = new
        self._server_instances[new] = self._server_instances.pop(old)
        if old in self._session_owners:
            self._session_owners[new] = self._session_owners.pop(old)

    async def _discard_session(self, session_id: str,
                               transport: StreamableHTTPServerTransport) -> None:
        self.slots.ended(session_id)  # the SDK forgets it before its first await, too
        await super()._discard_session(session_id, transport)
