"""The routes. Each handler is a thin translation between HTTP and :class:`Sandboxd` calls."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from sandboxd import __version__
from sandboxd.api import events
from sandboxd.api.auth import authenticate, guard
from sandboxd.errors import UnknownTool
from sandboxd.fork import MAX_FORKS, fork_session
from sandboxd.models import (
    InvokeRequest,
    LimitsRequest,
    PositiveNumber,
    Result,
    SessionInvokeRequest,
    ToolSpec,
)
from sandboxd.service import Sandboxd
from sandboxd.util.deadline import stop_task

router = APIRouter()


def _service(request: Request) -> Sandboxd:
    service: Sandboxd = request.app.state.service  # (set by create_app)
    return service


class SessionCreate(BaseModel):
    """Body of ``POST /v1/sessions`` (optional)."""

    model_config = ConfigDict(extra="forbid")
    ttl_s: PositiveNumber | None = Field(default=None, description="Lowered to the daemon maximum")


class ForkRequest(BaseModel):
    """Body of ``POST /v1/sessions/{id}/fork``."""

    model_config = ConfigDict(extra="forbid")
    count: int = Field(default=1, ge=1, le=MAX_FORKS,
                       description="Forks to make (each counts against max_sessions_per_client)")


class ExplainRequest(BaseModel):
    """Body of ``POST /v1/policy/explain``."""

    model_config = ConfigDict(extra="forbid")
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    limits: LimitsRequest | None = None


@router.get("/healthz", tags=["health"])
async def healthz() -> dict[str, str]:
    """Alive (the process answers). Says nothing about confinement: see /readyz."""
    return {"status": "ok", "version": __version__}


@router.get("/readyz", tags=["health"], dependencies=[Depends(guard("readyz"))])
async def readyz(request: Request) -> JSONResponse:
    """Ready when every available backend proves its confinement (self-test probes)."""
    state = await _service(request).readiness()
    return JSONResponse(state.model_dump(mode="json"), status_code=200 if state.ready else 503)


@router.get("/metrics", tags=["health"], dependencies=[Depends(guard("metrics"))])
async def metrics(request: Request) -> Response:
    """Prometheus metrics."""
    m = _service(request).metrics
    return Response(m.render(), media_type=m.content_type)


@router.get("/v1/capacity", tags=["health"])
async def capacity(request: Request, client: str = Depends(authenticate)) -> dict[str, Any]:
    """What this host holds and has room for: sessions (yours and every client's), live
    kernels and ``max_kernels``, sandbox uids, memory headroom; ``full`` names what would
    refuse a new session or kernel now."""
    return _service(request).capacity.view(client)


@router.get("/v1/tools", tags=["tools"], response_model=None)
async def list_tools(
    request: Request,
    format: Literal["sandboxd", "openai"] = Query(default="sandboxd"),
    client: str = Depends(authenticate),
) -> list[ToolSpec] | list[dict[str, Any]]:
    """The client's tools; ``?format=openai`` gives the OpenAI ``tools`` request field."""
    tools = _service(request).tools(client)
    if format == "openai":
        return [t.openai() for t in tools if t.available]
    return tools


@router.get("/v1/tools/{name}", tags=["tools"])
async def get_tool(name: str, request: Request,
                   client: str = Depends(authenticate)) -> ToolSpec:
    """One tool."""
    service = _service(request)
    for tool in service.tools(client):
        if tool.name == name:
            return tool
    raise UnknownTool(name, [t.name for t in service.tools(client)])


@router.post("/v1/tools/{name}/invoke", tags=["tools"], response_model=Result,
             responses={200: {"model": Result}})
async def invoke(name: str, body: InvokeRequest, request: Request,
                 client: str = Depends(authenticate)) -> Response:
    """Run a tool call. A policy denial is a 200 with ``status: denied``.

    If the caller disconnects before the result is ready, the call is cancelled and its
    processes or container are cleaned up. With ``Accept: text/event-stream`` the answer is
    a stream of Server-Sent Events while the call runs (:mod:`sandboxd.api.events`)."""
    service = _service(request)
    if events.wants_stream(request):
        return await events.stream_invoke(service, client, name, body, request)
    call = asyncio.create_task(service.invoke(client, name, body))
    gone = asyncio.create_task(events.disconnected(request))
    try:
        done, _ = await asyncio.wait({call, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if call not in done:
        await stop_task(call)
        return Response(status_code=499)  # nobody is listening any more
    # serialised by pydantic-core directly (FastAPI's generic encoder is ~10x slower)
    return Response(call.result().wire_json(), media_type="application/json")


@router.post("/v1/sessions/{session_id}/tools/{name}/invoke", tags=["tools", "sessions"],
             response_model=Result, responses={200: {"model": Result}})
async def invoke_in_session(session_id: str, name: str, body: SessionInvokeRequest,
                            request: Request,
                            client: str = Depends(authenticate)) -> Response:
    """:func:`invoke` in the session the path names, so that a proxy routes the call by its
    path alone (a fleet: docs/fleet.md). The path alone names the session: its body has no
    ``session`` (one would be a 422, as any member the schema does not have)."""
    full = InvokeRequest(arguments=body.arguments, limits=body.limits, session=session_id)
    return await invoke(name, full, request, client)


@router.post("/v1/sessions", tags=["sessions"], status_code=201)
async def create_session(request: Request, body: SessionCreate | None = None,
                         client: str = Depends(authenticate)) -> dict[str, Any]:
    """A new session with its own workspace."""
    service = _service(request)
    session = await service.create_session(client, body.ttl_s if body else None)
    return session.public(None)


@router.get("/v1/sessions", tags=["sessions"])
async def list_sessions(request: Request,
                        client: str = Depends(authenticate)) -> list[dict[str, Any]]:
    """The caller's sessions (never another client's), oldest first, with workspace usage
    and kernel state."""
    return await _service(request).list_sessions(client)


@router.get("/v1/sessions/{session_id}", tags=["sessions"])
async def get_session(session_id: str, request: Request,
                      client: str = Depends(authenticate)) -> dict[str, Any]:
    """A session of the caller's (another client's session is "not found")."""
    service = _service(request)
    return await service.session_view(service.session(client, session_id))


@router.post("/v1/sessions/{session_id}/fork", tags=["sessions"], status_code=201)
async def fork(session_id: str, request: Request, body: ForkRequest | None = None,
               client: str = Depends(authenticate)) -> dict[str, Any]:
    """``count`` new sessions of the caller, each with a copy of this session's workspace in
    a sandbox of its own; ``kernel.carried`` says whether the Python state came too (on the
    restricted backend; ``kernel.not_carried`` names what could not, ``kernel.reason`` says
    why nothing did). All or none, audited as ``session_forked``."""
    return await fork_session(_service(request), client, session_id,
                              body.count if body else 1)


@router.post("/v1/sessions/{session_id}/restart", tags=["sessions"])
async def restart_session(session_id: str, request: Request,
                          client: str = Depends(authenticate)) -> dict[str, Any]:
    """End the session's Python kernel (its variables); the next ``python`` call starts a
    fresh one in the same workspace. ``restarted`` names the backends whose kernel ended."""
    return await _service(request).restart_session(client, session_id)


@router.post("/v1/sessions/{session_id}/interrupt", tags=["sessions"])
async def interrupt_session(session_id: str, request: Request,
                            client: str = Depends(authenticate)) -> dict[str, Any]:
    """Interrupt the ``python`` call running in the session now: its code gets a
    ``KeyboardInterrupt``; that call ends ``killed`` (reason ``cancelled``) and, when the
    interpreter comes back within ``kernel_interrupt_grace_s``, keeps the session's variables
    (``kernel.interrupted``). ``interrupted`` names the backends whose call was interrupted
    (empty: no call was running)."""
    return await _service(request).interrupt_session(client, session_id)


@router.delete("/v1/sessions/{session_id}", tags=["sessions"], status_code=204)
async def delete_session(session_id: str, request: Request,
                         client: str = Depends(authenticate)) -> Response:
    """Delete a session, its workspace and anything a backend kept for it."""
    await _service(request).delete_session(client, session_id)
    return Response(status_code=204)


@router.post("/v1/policy/explain", tags=["policy"])
async def explain(body: ExplainRequest, request: Request,
                  client: str = Depends(authenticate)) -> dict[str, Any]:
    """The decision a call would get, and the rule that makes it, without running anything."""
    explanation = _service(request).explain(client, body.tool, body.arguments, body.limits)
    return {"client": client, "tool": body.tool,
            **explanation.decision.model_dump(mode="json"), "location": explanation.location}


@router.get("/v1/receipts/key", tags=["receipts"])
async def receipt_keys(request: Request,
                       client: str = Depends(authenticate)) -> dict[str, Any]:
    """The public keys that sign results' receipts (the current one and every retired one):
    all ``sandboxd receipt verify`` needs to check a receipt offline (docs/receipts.md)."""
    receipts = _service(request).recorder.receipts
    return receipts.key.keyset.document if receipts is not None else {"keys": []}
