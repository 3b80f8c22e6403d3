"""E2B's control plane (``E2B_API_URL``): create, connect, list, info, kill, set_timeout,
pause and resume.

A sandbox is a session of the caller's (:mod:`sandboxd.api.e2b.sandboxes`): made, ended and
timed by the service's own session methods, audited with ``transport: e2b``. The access
tokens a create answers with are the caller's own token (:mod:`sandboxd.api.e2b.access`).
E2B's pause is the container backend's idle pause asked for now (the container frozen, its
kernel's state kept in memory); a connect or resume, or any later call, thaws it.
Whatever else E2B's API offers (fork, snapshots, metrics, logs, network
updates, templates, volumes) answers 501 naming it (:func:`not_served`), never a 404.
"""

from __future__ import annotations

import time
import urllib.parse
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from sandboxd.api.e2b.access import E2bRoute, e2b_client, json_body, presented_token
from sandboxd.api.e2b.sandboxes import E2bSandbox, Sandboxes, not_served
from sandboxd.api.problems import Problem
from sandboxd.protocol.environment import check_env
from sandboxd.service import Sandboxd

router = APIRouter(route_class=E2bRoute, include_in_schema=False)
#: the envd version sandboxd's sandbox plane answers as: the SDKs pick their wire format by
#: it (0.5.x: multipart uploads, stdin always on; what sandboxd.api.e2b.process/files serve)
ENVD_VERSION = "0.5.6"
#: options of a create that sandboxd cannot honour: refused by name, never ignored
_REFUSED_OPTIONS = {"autoPause": "auto-pause", "autoResume": "auto-resume",
                    "mcp": "MCP gateway", "volumeMounts": "volume mounts",
                    "network": "per-sandbox network rules (the policy decides the network)"}


def _sandboxes(request: Request) -> Sandboxes:
    sandboxes: Sandboxes = request.app.state.e2b
    return sandboxes


def _iso(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).isoformat().replace("+00:00", "Z")


def _created(request: Request, record: E2bSandbox) -> dict[str, Any]:
    token = presented_token(request) or None
    service: Sandboxd = request.app.state.service
    return {"sandboxID": record.id, "templateID": record.template, "alias": record.template,
            "clientID": service.settings.node_id, "envdVersion": ENVD_VERSION,
            "envdAccessToken": token, "trafficAccessToken": token, "domain": None}


def _listed(request: Request, record: E2bSandbox) -> dict[str, Any]:
    service: Sandboxd = request.app.state.service
    return {"sandboxID": record.id, "templateID": record.template, "alias": record.template,
            "clientID": service.settings.node_id, "startedAt": _iso(record.started_at),
            "endAt": _iso(_sandboxes(request).expires_at(record)), "cpuCount": 1,
            "memoryMB": 0, "diskSizeMB": 0, "state": _state(request, record),
            "envdVersion": ENVD_VERSION,
            "metadata": record.metadata}


def _state(request: Request, record: E2bSandbox) -> str:
    return "paused" if _sandboxes(request).paused(record) else "running"


def _strings(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise Problem(400, "e2b-body", "Bad request", f"{name} maps strings to strings")
    return value


def _timeout(body: dict[str, Any]) -> float | None:
    timeout = body.get("timeout")
    if timeout is None:
        return None
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        raise Problem(400, "e2b-body", "Bad request", "timeout is a positive number of seconds")
    return float(timeout)


@router.post("/v2/sandboxes", status_code=201)
@router.post("/sandboxes", status_code=201)
async def create(request: Request, client: str = Depends(e2b_client)) -> Response:
    body = await json_body(request)
    for option, feature in _REFUSED_OPTIONS.items():
        if body.get(option):
            raise not_served(feature)
    try:
        envs = check_env(_strings(body.get("envVars"), "envVars"), "envs")
    except ValueError as exc:
        raise Problem(400, "e2b-envs", "Environment refused", str(exc)) from None
    template = body.get("templateID")
    if not isinstance(template, str) or not template:
        raise Problem(400, "e2b-body", "Bad request", "templateID names a template")
    record = await _sandboxes(request).create(client, template, _timeout(body),
                                              _strings(body.get("metadata"), "metadata"), envs)
    return JSONResponse(_created(request, record), status_code=201)


@router.post("/v2/sandboxes/{sandbox_id}/connect")
@router.post("/sandboxes/{sandbox_id}/connect")
async def connect(sandbox_id: str, request: Request,
                  client: str = Depends(e2b_client)) -> Response:
    """Connect to a sandbox, resuming it when it is paused; a timeout given extends it
    (never shortens, as E2B)."""
    sandboxes = _sandboxes(request)
    record = sandboxes.get(client, sandbox_id)
    body = await json_body(request)
    timeout = _timeout(body)
    if body.get("memory") is False:  # on_resume="reboot": a cold boot from the disk alone
        raise not_served("resume by reboot", "a paused sandbox resumes with its memory")
    if sandboxes.paused(record):
        await sandboxes.resume(record)
    if timeout is not None and time.time() + timeout > sandboxes.expires_at(record):
        await sandboxes.set_timeout(record, timeout)
    return JSONResponse(_created(request, record))


@router.get("/v2/sandboxes")
@router.get("/sandboxes")
async def list_sandboxes(request: Request, client: str = Depends(e2b_client)) -> Response:
    """The caller's sandboxes (never another client's), filtered by metadata and state."""
    wanted = _wanted_metadata(request.query_params.get("metadata"))
    states = set(filter(None, request.query_params.get("state", "").split(",")))
    template = request.query_params.get("template")
    records = sorted(_sandboxes(request).owned(client), key=lambda r: r.started_at)
    return JSONResponse([_listed(request, r) for r in records
                         if _selected(request, r, wanted, states, template)])


def _wanted_metadata(raw: str | None) -> dict[str, str]:
    """The metadata a listing filters on: the SDKs quote each key and value, then urlencode
    the pairs."""
    if not raw:
        return {}
    return {urllib.parse.unquote(k): urllib.parse.unquote(v)
            for k, v in urllib.parse.parse_qsl(raw, keep_blank_values=True)}


def _selected(request: Request, record: E2bSandbox, wanted: dict[str, str], states: set[str],
              template: str | None) -> bool:
    """Whether a sandbox is listed: its metadata holds ``wanted``, its state is one of
    ``states`` and its template ``template`` (each: when given)."""
    return (all(record.metadata.get(k) == v for k, v in wanted.items())
            and (not states or _state(request, record) in states)
            and (not template or record.template == template))


@router.api_route("/sandboxes/metrics", methods=["GET"])
@router.api_route("/templates{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
@router.api_route("/v2/templates{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
@router.api_route("/v3/templates{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
@router.api_route("/volumes{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
async def unserved_api(request: Request, client: str = Depends(e2b_client)) -> Response:
    what = request.url.path.strip("/").split("/")
    raise not_served(" ".join(w for w in what if not w.startswith("v")) or "API")


@router.get("/sandboxes/{sandbox_id}")
async def info(sandbox_id: str, request: Request, client: str = Depends(e2b_client)) -> Response:
    record = _sandboxes(request).get(client, sandbox_id)
    token = presented_token(request) or None
    return JSONResponse({**_listed(request, record), "envdAccessToken": token, "domain": None,
                         "allowInternetAccess": False})


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
async def kill(sandbox_id: str, request: Request, client: str = Depends(e2b_client)) -> Response:
    """End the sandbox: its session, containers and workspace (verified, audited)."""
    sandboxes = _sandboxes(request)
    await sandboxes.kill(sandboxes.get(client, sandbox_id))
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
async def set_timeout(sandbox_id: str, request: Request,
                      client: str = Depends(e2b_client)) -> Response:
    """The sandbox ends ``timeout`` seconds from now (lowered to the daemon's session TTL);
    like every session's, a call extends it by its TTL again."""
    sandboxes = _sandboxes(request)
    record = sandboxes.get(client, sandbox_id)
    timeout = _timeout(await json_body(request))
    if timeout is None:
        raise Problem(400, "e2b-body", "Bad request", "the body is {\"timeout\": seconds}")
    await sandboxes.set_timeout(record, timeout)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/pause", status_code=204)
async def pause(sandbox_id: str, request: Request, client: str = Depends(e2b_client)) -> Response:
    """Pause the sandbox now: its container frozen (no CPU), its kernel's state kept; 409
    when it is paused already (the SDKs then answer False), 422 when nothing can be."""
    sandboxes = _sandboxes(request)
    record = sandboxes.get(client, sandbox_id)
    if (await json_body(request)).get("memory") is False:  # mode="filesystem"
        raise not_served("filesystem-only pause", "a pause keeps the sandbox's memory")
    if sandboxes.paused(record):
        raise Problem(409, "e2b-paused", "Already paused", f"sandbox '{sandbox_id}' is paused")
    await sandboxes.pause(record)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/resume", status_code=201)
async def resume(sandbox_id: str, request: Request,
                 client: str = Depends(e2b_client)) -> Response:
    """Resume a paused sandbox (E2B's older call; the SDKs' ``connect`` resumes too)."""
    sandboxes = _sandboxes(request)
    record = sandboxes.get(client, sandbox_id)
    timeout = _timeout(await json_body(request))
    if not sandboxes.paused(record):
        raise Problem(409, "e2b-running", "Not paused", f"sandbox '{sandbox_id}' is running")
    await sandboxes.resume(record)
    if timeout is not None and time.time() + timeout > sandboxes.expires_at(record):
        await sandboxes.set_timeout(record, timeout)
    return JSONResponse(_created(request, record), status_code=201)


_NOT_SERVED = {
    ("POST", "fork"): "fork",
    ("POST", "snapshots"): "snapshots", ("POST", "refreshes"): "refreshes",
    ("GET", "metrics"): "sandbox metrics", ("GET", "logs"): "sandbox logs",
    ("PUT", "network"): "network updates",
}


@router.api_route("/sandboxes/{sandbox_id}/{feature}", methods=["GET", "POST", "PUT"])
@router.api_route("/v2/sandboxes/{sandbox_id}/{feature}", methods=["GET", "POST", "PUT"])
async def unserved(sandbox_id: str, feature: str, request: Request,
                   client: str = Depends(e2b_client)) -> Response:
    _sandboxes(request).get(client, sandbox_id)  # an unknown sandbox is still "not found"
    raise not_served(_NOT_SERVED.get((request.method, feature), f"/sandboxes/{{id}}/{feature}"))
