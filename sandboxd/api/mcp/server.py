"""The MCP front door: sandboxd as a Model Context Protocol server (Streamable HTTP at ``/mcp``).

MCP is another door to the same :class:`~sandboxd.service.Sandboxd`, never a second code path
(this module and the SDK are loaded on the first request to ``/mcp``: :mod:`sandboxd.api.mcp.door`):

* **auth**: the HTTP API's own :func:`~sandboxd.api.auth.authenticate` (same tokens, same 401
  problem+json, same aggregated ``auth_failure`` audit records, same rate limits). The client
  name is bound to the MCP session: another token presenting its session id gets a 404.
* **tools/list**: ``Sandboxd.tools(client)``, the list ``GET /v1/tools`` returns (name,
  description, ``inputSchema`` = the policy's parameters). After a policy reload changes a
  session's list, ``notifications/tools/list_changed`` goes out on its standalone stream.
* **tools/call**: ``Sandboxd.invoke(..., transport="mcp")``: schema check, policy, audit,
  scheduler, backend and cleanup are the HTTP call's. ``content`` is
  :func:`~sandboxd_client.render.format_result` (what the agent loop shows a model), split
  so that each image display item follows, as ``image`` content, the text naming it,
  ``structuredContent`` the whole sandboxd result, ``isError`` every status but ``ok``. Bad
  arguments are an ``isError`` result the model can read (2025-11-25 on, SEP-1303; a JSON-RPC error
  -32602 naming the field in earlier revisions), unknown tools -32602. A caller may lower
  the call's limits with ``_meta: {"sandboxd/limits": {"timeout_s": 5, ...}}``.
* **sessions**: each MCP session gets its own sandboxd session (workspace), created on its first
  call and deleted when the MCP session ends (client DELETE, idle expiry, daemon shutdown).
  MCP sessions are capped per client and in total, and one that never called a tool idles
  out after ``mcp_session_idle_s`` (:mod:`sandboxd.api.mcp.sessions`). A client whose last
  token is removed or expires loses its MCP sessions (:mod:`sandboxd.api.revocation`).
* **long calls**: ``notifications/progress`` (elapsed time) every ``progress_interval_s`` while
  a call runs, when the client sent a progress token; ``notifications/cancelled`` cancels the
  service's invoke task exactly as an HTTP disconnect does (the backend kills and verifies).

Both protocol eras are served (docs/mcp.md, "Protocol versions"): the initialize handshake
(2024-11-05 ... 2025-11-25: an MCP session, its workspace, list_changed on its stream) and the
stateless 2026-07-28 (the SDK's own per-request path: ``server/discover``, the ``_meta``
envelope and routing headers; no MCP session, so state travels in a handle: the result names
the sandboxd session the call ran in and the model passes it back as the tools' ``session``
argument, :mod:`sandboxd.api.mcp.handles`). The request's ``MCP-Protocol-Version`` picks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS, is_version_at_least
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from sandboxd import __version__
from sandboxd.api import problems
from sandboxd.api.auth import authenticate
from sandboxd.api.mcp import forking
from sandboxd.api.mcp import handles as mcp_handles
from sandboxd.api.mcp.elicit import call_context
from sandboxd.api.mcp.envelope import (
    envelope_error,
    replay_body,
    request_id,
    with_request_id,
)
from sandboxd.api.mcp.meta import (
    ARGUMENT_ERRORS_AS_RESULTS,
    INSTRUCTIONS,
    STATELESS_INSTRUCTIONS,
    VERSIONS,
    limits,
    named_session,
    unsupported_version,
)
from sandboxd.api.mcp.results import (
    call_result,
    error_result,
    named_result,
    problem_answer,
    tool_for,
)
from sandboxd.api.mcp.sessions import TICKET, McpSessionLimit, SessionManager, SessionSlots
from sandboxd.errors import SandboxdError
from sandboxd.models import InvokeRequest, Result, ToolSpec
from sandboxd.service import Sandboxd
from sandboxd.sessions.manager import SessionError
from sandboxd.util.deadline import stop_task

log = logging.getLogger("sandboxd.mcp")

TRANSPORT = "mcp"
CLIENT_KEY = "sandboxd.client"
PROGRESS_INTERVAL_S = 1.0
CANCEL_GRACE_S = 60.0  # how long a cancelled call may take to prove its cleanup


def _stateless(ctx: Any) -> bool:
    """The request speaks the stateless revision (no MCP session: state travels in handles)."""
    return ctx.session.protocol_version in MODERN_PROTOCOL_VERSIONS


def _fingerprint(specs: list[ToolSpec]) -> str:
    data = [spec.model_dump(mode="json") for spec in specs]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _connection(ctx: Any) -> Any:
    """The SDK ``Connection`` of a request: per-MCP-session ``state``, ``exit_stack`` (runs when
    the session ends), ``session_id`` and the standalone ``notify``. The lowlevel context does not
    expose it yet (mcp 2.3: ``ServerSession._connection``), hence the pinned SDK range."""
    return ctx.session._connection


class _Server(Server[Any]):
    """The SDK's server, announcing ``tools.listChanged`` in its initialize result (the
    handshake era; 2026-07-28 has no standalone stream to announce it on)."""

    def create_initialization_options(self, notification_options: NotificationOptions | None = None,
                                      *args: Any, **kwargs: Any) -> Any:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), *args, **kwargs)

    async def _handle_discover(self, ctx: Any, params: Any) -> types.DiscoverResult:
        """``server/discover`` (2026-07-28): the SDK's answer, with the stateless era's
        instructions (no MCP session keeps a workspace there)."""
        result = await super()._handle_discover(ctx, params)
        result.instructions = STATELESS_INSTRUCTIONS
        return result


class McpFrontDoor:
    """The ``/mcp`` ASGI endpoint and the MCP server behind it (one per daemon)."""

    def __init__(self, service: Sandboxd, *,
                 progress_interval_s: float = PROGRESS_INTERVAL_S) -> None:
        self.service = service
        self.progress_interval_s = progress_interval_s
        self.server = _Server(
            "sandboxd", version=__version__, instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools, on_call_tool=self._call_tool,
        )
        settings = service.settings
        per_client = settings.mcp_max_sessions_per_client or settings.max_sessions_per_client
        self.handles = mcp_handles.Handles(service, per_client)
        self.slots = SessionSlots(
            per_client=per_client,
            total=settings.mcp_max_sessions, idle_s=settings.mcp_session_idle_s,
            ttl_s=settings.session_ttl_s, on_change=service.metrics.mcp_sessions.set)
        self.manager = SessionManager(self.server, self.slots, settings.node_id)
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = asyncio.Event()
        self._calls = 0  # tools/call handlers running now
        self._serving = False  # the session manager runs (inside run())

    # ------------------------------------------------------------ life cycle

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """The session manager's task group, inside the app's lifespan after the service
        started. When the daemon drains (SIGTERM), the MCP sessions end once their calls are
        done (their open notification streams would otherwise hold the server up); each
        ending deletes its sandboxd session."""
        self._loop = asyncio.get_running_loop()
        ready = asyncio.Event()

        async def hold() -> None:
            async with self.manager.run():
                ready.set()
                await self._stop.wait()

        holder = asyncio.create_task(hold(), name="mcp-sessions")
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait({holder, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if holder.done():
            holder.result()  # it failed to start: raise its error
        self._serving = True
        watcher = asyncio.create_task(self._stop_when_draining(), name="mcp-drain")
        self.service.policy_listeners.append(self._policy_changed)
        try:
            yield
        finally:
            with contextlib.suppress(ValueError):
                self.service.policy_listeners.remove(self._policy_changed)
            self._serving = False
            self._stop.set()
            await stop_task(watcher)
            await holder

    async def _stop_when_draining(self) -> None:
        while not self.service.draining:
            await asyncio.sleep(0.2)
        while self._calls:  # the service's drain cancels them after its grace period
            await asyncio.sleep(0.1)
        self._stop.set()

    # ------------------------------------------------------------ ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Authenticate like the HTTP API, then hand the request to the SDK."""
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        try:
            client = await self._admit(request)
        except problems.Problem as exc:
            await problems.problem_response(exc)(scope, receive, send)
            return
        ident: str | int | None = None
        if scope["method"] == "POST":  # the envelope first: the SDK drops some bad ones
            body = await request.body()
            error = envelope_error(body)
            if error is not None:
                await JSONResponse(error, status_code=400)(scope, receive, send)
                return
            ident = request_id(body)
            receive = replay_body(body, receive)
            send = with_request_id(send, ident)  # the SDK's own refusals say "id": null
        version = request.headers.get("mcp-protocol-version")
        if version is not None and version not in VERSIONS:
            await unsupported_version(version, ident)(scope, receive, send)
            return
        self.service.metrics.mcp_requests.labels(method=f"http_{scope['method']}").inc()
        scope[CLIENT_KEY] = client
        # the SDK binds a session to the identity that opened it: another client presenting its
        # id is answered 404 (the token itself is not kept)
        scope["user"] = AuthenticatedUser(AccessToken(token="-", client_id=client, scopes=[]))
        await self._route(scope, receive, send, client, ident)

    async def _admit(self, request: Request) -> str:
        """The client of a request, authenticated like the HTTP API's (a 503 problem once the
        daemon drains)."""
        if self._stop.is_set() or not self._serving:
            raise problems.Problem(
                503, "draining", "Shutting down",
                "the daemon is shutting down; retry on another instance or later",
                headers={"Retry-After": "5"})
        return await authenticate(request)

    async def _route(self, scope: Scope, receive: Receive, send: Send, client: str,
                     ident: str | int | None) -> None:
        """Hand an admitted request to the SDK: a 2026-07-28 request as it is, one of an open
        session as that session's (a DELETE frees its slot), any other within the caps on
        MCP sessions (:meth:`_open`)."""
        headers = Headers(scope=scope)
        session_id = headers.get("mcp-session-id")
        if headers.get("mcp-protocol-version") in MODERN_PROTOCOL_VERSIONS:
            # 2026-07-28: one request, one answer, no session to open (the SDK checks the
            # per-request envelope: _meta and the Mcp-Method/Mcp-Name headers)
            await self.manager.handle_request(scope, receive, send)
            return
        if session_id is not None:
            if scope["method"] == "DELETE":
                send = self.slots.freeing(session_id, send)
            await self.manager.handle_request(scope, receive, send)
            return
        await self._open(scope, receive, send, client, ident)

    async def _open(self, scope: Scope, receive: Receive, send: Send, client: str,
                    ident: str | int | None) -> None:
        """Hand the SDK a request that may open a session: a slot first (or 429 naming the
        cap), settled once the SDK is done with it."""
        try:
            ticket = self.slots.reserve(client)
        except McpSessionLimit as exc:
            self.service.metrics.rejections.labels(reason="mcp_sessions").inc()
            await exc.response(ident)(scope, receive, send)
            return
        reset = TICKET.set(ticket)
        try:
            await self.manager.handle_request(scope, receive, send)
        finally:
            TICKET.reset(reset)
            self.slots.settle(ticket)

    # ------------------------------------------------------------ handlers

    def _client(self, ctx: Any) -> str:
        request = ctx.request
        client: str | None = request.scope.get(CLIENT_KEY) if request is not None else None
        if not client:  # pragma: no cover - every request passes through __call__
            raise MCPError(types.INVALID_REQUEST, "unauthenticated MCP request")
        connection = _connection(ctx)
        state = connection.state
        if "client" not in state:
            state["client"] = client
            state["lock"] = asyncio.Lock()
            self._connections.add(connection)
            connection.exit_stack.push_async_callback(self._connection_ended, connection)
        elif state["client"] != client:  # the SDK refuses this already; never trust one check
            raise MCPError(types.INVALID_REQUEST, "this MCP session belongs to another client")
        return client

    async def _list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        self.service.metrics.mcp_requests.labels(method="tools/list").inc()
        client = self._client(ctx)
        specs = self.service.tools(client)
        connection = _connection(ctx)
        if connection.session_id is not None:  # a 2026-07-28 request has no stream to notify
            connection.state["tools"] = _fingerprint(specs)
        handle = _stateless(ctx)
        tools = [tool_for(s, handle) for s in specs]
        if forking.NAME not in {s.name for s in specs}:  # a policy tool of its name keeps it
            tools.append(forking.TOOL)
        return types.ListToolsResult(tools=tools)

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams
                         ) -> types.CallToolResult:
        self.service.metrics.mcp_requests.labels(method="tools/call").inc()
        client = self._client(ctx)
        self.slots.in_use(_connection(ctx).session_id)  # from now on: the session TTL
        counter = self.service.metrics.mcp_calls
        if params.name == forking.NAME and forking.NAME not in {
                s.name for s in self.service.tools(client)}:
            return await self._fork(ctx, client, params)
        named: str | None = None  # the session a stateless answer names (the handle)
        try:
            lower = limits(params.meta)
            arguments = dict(params.arguments or {})
            session, named = await self._session(ctx, client, params, arguments)
            request = InvokeRequest(arguments=arguments, session=session, limits=lower)
            with self.handles.use(named) if named else contextlib.nullcontext():
                result = await self._run(ctx, client, params.name, request)
        except SandboxdError as exc:  # answered as the outcome table's row for its problem
            answer = problems.MCP_ANSWERS.get(exc.code)
            if answer is None:
                raise
            counter.labels(tool=params.name, status=answer.counted).inc()
            return problem_answer(exc, answer, ctx.session.protocol_version, named)
        counter.labels(tool=params.name, status=result.status.value).inc()
        return named_result(call_result(result), named)

    async def _session(self, ctx: Any, client: str, params: types.CallToolRequestParams,
                       arguments: dict[str, Any]) -> tuple[str | None, str | None]:
        """The session a call runs in, and the one its answer names (a stateless call's
        handle, named or minted: :mod:`.handles`); else the one ``_meta`` names or the MCP
        session's own."""
        if _stateless(ctx):
            sid = await self.handles.session_for(client, params.name, arguments,
                                                 named_session(params.meta))
            return sid, sid
        return (named_session(params.meta)
                or await self._sandbox_session(_connection(ctx), client)), None

    async def _fork(self, ctx: Any, client: str,
                    params: types.CallToolRequestParams) -> types.CallToolResult:
        """The ``fork_session`` tool (:mod:`.forking`); bad arguments as any tool's."""
        counter = self.service.metrics.mcp_calls
        try:
            answer = await forking.call(self.service, client, dict(params.arguments or {}),
                                        TRANSPORT)
        except forking.BadArguments as exc:
            counter.labels(tool=forking.NAME, status="invalid_params").inc()
            if is_version_at_least(ctx.session.protocol_version, ARGUMENT_ERRORS_AS_RESULTS):
                return error_result(f"nothing ran: {exc}; fix the arguments and call again")
            raise MCPError(types.INVALID_PARAMS, str(exc),
                           {"tool": forking.NAME, "field": exc.field,
                            "problem": exc.problem}) from None
        counter.labels(tool=forking.NAME, status="error" if answer.is_error else "ok").inc()
        return answer

    async def _run(self, ctx: Any, client: str, tool: str,
                   request: InvokeRequest) -> Result:
        """The service's one invoke path, with progress while it runs and cancellation (the
        SDK cancels this handler on ``notifications/cancelled`` or when the session ends)."""
        call = asyncio.create_task(
            self.service.invoke(client, tool, request, transport=TRANSPORT),
            name=f"mcp-call-{tool}", context=call_context(ctx))  # a gated call may ask the host
        started = time.monotonic()
        self._calls += 1
        try:
            while True:
                done, _ = await asyncio.wait({call}, timeout=self.progress_interval_s)
                if done:
                    return call.result()
                elapsed = time.monotonic() - started
                with contextlib.suppress(Exception):  # progress is best effort
                    await ctx.session.report_progress(
                        round(elapsed, 1), None, f"{tool}: running for {elapsed:.0f} s")
        except BaseException:
            if not call.done():
                call.cancel()
                # the backend kills and verifies in the call's own task; wait for it (and its
                # audit record) even though this handler is being cancelled
                with anyio.CancelScope(shield=True):
                    await asyncio.wait({call}, timeout=CANCEL_GRACE_S)
            if call.done() and not call.cancelled():
                call.exception()  # retrieved: no "exception was never retrieved" noise
            raise
        finally:
            self._calls -= 1

    # ------------------------------------------------------------ sessions

    async def _sandbox_session(self, connection: Any, client: str) -> str | None:
        """The sandboxd session of this MCP session, created on first use (None without an MCP
        session id: a one-shot workspace per call)."""
        if connection.session_id is None:
            return None
        state = connection.state
        async with state["lock"]:
            sid: str | None = state.get("sandbox_session")
            if sid is not None:
                try:
                    self.service.session(client, sid)
                    return sid
                except SessionError:  # expired under a long-idle MCP session: a new one
                    log.info("MCP session %s: sandboxd session %s expired; a new one",
                             connection.session_id[:8], sid)
            session = await self.service.create_session(client, None, transport=TRANSPORT)
            state["sandbox_session"] = session.id
            return session.id

    async def _connection_ended(self, connection: Any) -> None:
        """The MCP session ended: delete its sandboxd session (workspace)."""
        self._connections.discard(connection)
        state = connection.state
        sid = state.pop("sandbox_session", None)
        if sid is None:
            return
        try:
            await self.service.delete_session(state["client"], sid, transport=TRANSPORT)
        except SessionError:
            pass  # expired already
        except Exception:
            log.exception("MCP session ended: deleting sandboxd session %s failed", sid)

    def clients(self) -> set[str]:
        """The clients that own an MCP session now."""
        owners = list(self.manager._session_owners.values())
        return {owner["client_id"] for owner in owners if owner["client_id"]}

    async def end_client(self, client: str) -> list[str]:
        """End every MCP session of ``client`` (its last token is gone): each answers 404 from
        now on and its running calls are cancelled (their backends kill and verify). Their
        sandboxd sessions are left to the caller: the service's revocation ends them with the
        client's others, through its one close path. Returns the ended MCP sessions (their
        ids' first 8 characters, as the logs name them)."""
        manager = self.manager  # the SDK's session table (mcp 2.3; see _connection)
        by_id = {c.session_id: c for c in list(self._connections)}
        ended: list[str] = []
        for sid, owner in list(manager._session_owners.items()):
            if owner["client_id"] != client:
                continue
            connection = by_id.get(sid)
            if connection is not None:  # its sandboxd session is not deleted by the exit hook
                connection.state.pop("sandbox_session", None)
            await self._discard(sid)
            ended.append(sid[:8])
        return ended

    async def _discard(self, sid: str) -> None:
        """Forget the MCP session ``sid`` (404 from now on) and end its server task, as idle
        expiry does."""
        manager = self.manager
        transport = manager._server_instances.get(sid)
        if transport is None:
            return
        await manager._discard_session(sid, transport)
        if transport.idle_scope is not None:
            transport.idle_scope.cancel()

    # ------------------------------------------------------------ list_changed

    def _policy_changed(self) -> None:
        """A policy load took effect (SIGHUP, file change): announce changed tool lists."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.create_task(self._announce())
        else:
            loop.call_soon_threadsafe(lambda: loop.create_task(self._announce()))

    async def _announce(self) -> None:
        for connection in list(self._connections):
            state = connection.state
            client = state.get("client")
            if client is None or "tools" not in state:
                continue  # it never listed tools: nothing of its view changed
            now = _fingerprint(self.service.tools(client))
            if now == state["tools"]:
                continue
            state["tools"] = now
            self.service.metrics.mcp_requests.labels(method="tools/list_changed").inc()
            await connection.notify("notifications/tools/list_changed", None)
