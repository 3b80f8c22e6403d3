"""Who calls, and which sandbox: E2B's headers onto sandboxd's own token check.

E2B's SDKs send the API key as ``X-API-Key`` to the control plane and, to the sandbox plane,
the ``envdAccessToken`` / ``trafficAccessToken`` the create answer gave (``X-Access-Token``,
``E2B-Traffic-Access-Token``). sandboxd answers both with the caller's own token, so every
request of either plane is checked by :func:`sandboxd.api.auth.authenticate_now` as a native
call is: the same token file, failed-authentication guard and rate limit. A sandbox is then
found with :meth:`SessionManager.get` for that client only: another client's id (a forged
``E2b-Sandbox-Id``) is "not found", exactly as another client's session is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from sandboxd.api.auth import LOCAL_CLIENT, authenticate_now
from sandboxd.api.problems import Problem, problem_body
from sandboxd.errors import SandboxdError

log = logging.getLogger("sandboxd")

#: the headers an E2B SDK may carry its key in, in the order they are tried
TOKEN_HEADERS = ("x-api-key", "x-access-token", "e2b-traffic-access-token")
SANDBOX_HEADER = "e2b-sandbox-id"


def presented_token(request: Request) -> str:
    """The token the request carries in any of E2B's headers, else in ``Authorization``."""
    for name in TOKEN_HEADERS:
        value = request.headers.get(name, "").strip()
        if value:
            return value
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def e2b_client(request: Request) -> str:
    """FastAPI dependency: the sandboxd client of an E2B request (401/429 problems as for a
    native call). The token is handed to the one check as the bearer it is."""
    if request.app.state.tokens is None:
        return LOCAL_CLIENT
    token = presented_token(request)
    headers = [(k, v) for k, v in request.scope["headers"] if k != b"authorization"]
    if token:
        headers.append((b"authorization", f"Bearer {token}".encode("latin-1", "replace")))
    bearer = Request({**request.scope, "headers": headers}, request.receive)
    return await run_in_threadpool(authenticate_now, bearer)


async def json_body(request: Request) -> dict[str, Any]:
    """A request's JSON object (an empty body is ``{}``), or a 400 that says what is wrong."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise Problem(400, "e2b-body", "Bad request", f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise Problem(400, "e2b-body", "Bad request", "the body is a JSON object")
    return body


def sandbox_id(request: Request) -> str:
    """The sandbox a sandbox-plane request names (``E2b-Sandbox-Id``), or a 400."""
    value = request.headers.get(SANDBOX_HEADER, "").strip()
    if not value:
        raise Problem(400, "e2b-sandbox-id", "Missing E2b-Sandbox-Id",
                      "a sandbox-plane request names its sandbox in the E2b-Sandbox-Id header "
                      "(the E2B SDKs send it when E2B_SANDBOX_URL is set)")
    return value


class E2bRoute(APIRoute):
    """A route whose errors leave as E2B's API writes them, ``{"code", "message"}`` (what
    the SDKs read), with sandboxd's problem members beside them."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                return error_response(exc)

        return answer


def error_response(exc: Exception) -> JSONResponse:
    if not isinstance(exc, Problem | SandboxdError):
        log.exception("an E2B request failed")
    body = problem_body(exc)
    headers = (exc.headers if isinstance(exc, Problem)
               else exc.problem_headers() if isinstance(exc, SandboxdError) else {})
    return JSONResponse({"code": body["status"], "message": body["detail"], **body},
                        status_code=body["status"], headers=headers)
