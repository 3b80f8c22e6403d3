"""RFC 9457 problem details for every HTTP error, with messages a person or a model can act on."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sandboxd.registry import ArgumentsInvalid
from sandboxd.scheduler import Overloaded
from sandboxd.service import (
    AuditFailure,
    Draining,
    ExecutionFailure,
    ServiceError,
    StorageUnavailable,
    ToolUnavailable,
    UnknownTool,
)
from sandboxd.sessions import (
    SessionError,
    SessionLimitReached,
    SessionNotFound,
    SessionOverQuota,
)

PROBLEM_TYPE = "https://sandboxd.dev/problems/"
MEDIA_TYPE = "application/problem+json"
#: Retry-After of a 503 for a backend that is down (its watch reconnects within seconds)
UNAVAILABLE_RETRY_S = 5


class Problem(Exception):
    """An HTTP error to render as problem+json."""

    def __init__(self, status: int, slug: str, title: str, detail: str,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.title = title
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra


def problem_response(problem: Problem, request: Request | None = None) -> JSONResponse:
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE + problem.slug,
        "title": problem.title,
        "status": problem.status,
        "detail": problem.detail,
    }
    if request is not None:
        body["instance"] = request.url.path
    body.update(problem.extra)
    return JSONResponse(body, status_code=problem.status, headers=problem.headers,
                        media_type=MEDIA_TYPE)


def _validation_problem(exc: RequestValidationError) -> Problem:
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    field = ".".join(loc) or "(body)"
    message = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":
        why = first.get("ctx", {}).get("error", "")
        return Problem(400, "invalid-json", "Request body is not valid JSON",
                       f"the request body is not valid JSON: {why}".rstrip(": "))
    return Problem(
        422, "invalid-request", "Invalid request",
        f"'{field}': {message}", field=field,
        errors=[{"field": ".".join(str(p) for p in e.get("loc", ()) if p != "body"),
                 "message": e.get("msg", "")} for e in errors[:20]],
    )


def _map(exc: Exception) -> Problem:
    if isinstance(exc, Problem):
        return exc
    if isinstance(exc, ArgumentsInvalid):
        return Problem(422, "invalid-arguments", "Invalid tool arguments", str(exc),
                       field=exc.field, tool=exc.tool)
    if isinstance(exc, UnknownTool):
        return Problem(404, "unknown-tool", "Unknown tool", str(exc),
                       available_tools=exc.available)
    if isinstance(exc, SessionNotFound):
        return Problem(404, "unknown-session", "Unknown session", str(exc))
    if isinstance(exc, SessionLimitReached):
        return Problem(409, "too-many-sessions", "Too many sessions", str(exc))
    if isinstance(exc, SessionOverQuota):
        return Problem(409, "session-over-quota", "Session workspace over quota", str(exc))
    if isinstance(exc, Overloaded):
        return Problem(429, "overloaded", "Too many calls", str(exc),
                       headers={"Retry-After": str(exc.retry_after)},
                       retry_after=exc.retry_after)
    if isinstance(exc, Draining):
        return Problem(503, "draining", "Shutting down", str(exc), headers={"Retry-After": "5"})
    if isinstance(exc, ToolUnavailable):
        return Problem(503, "tool-unavailable", "Tool unavailable", str(exc),
                       headers={"Retry-After": str(UNAVAILABLE_RETRY_S)},
                       retry_after=UNAVAILABLE_RETRY_S)
    if isinstance(exc, StorageUnavailable):
        return Problem(507, "storage-full", "Insufficient storage", str(exc))
    if isinstance(exc, AuditFailure):
        extra = {} if exc.result is None else {"result": exc.result.model_dump(mode="json")}
        return Problem(507 if exc.storage else 500, "audit-failure", "Audit log unavailable",
                       str(exc), ran=exc.result is not None, **extra)
    if isinstance(exc, ExecutionFailure):
        return Problem(500, "execution-failure", "Execution failed", str(exc))
    return Problem(500, "internal", "Internal error",
                   "an unexpected error happened; the administrator can find it in the logs")


def _allowed_methods(request: Request) -> list[str]:
    """The methods of every route whose path matches the request's."""
    from starlette.routing import Match

    methods: set[str] = set()
    scope = {**request.scope, "method": "GET"}
    routes = list(request.app.router.routes)
    while routes:
        route = routes.pop()
        nested = getattr(route, "original_router", None)  # an included router
        if nested is not None:
            routes.extend(nested.routes)
            continue
        match, _ = route.matches(scope)
        route_methods = getattr(route, "methods", None)
        if match is not Match.NONE and route_methods:
            methods |= set(route_methods)
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


def install(app: FastAPI) -> None:
    """Register handlers so that every error leaves as problem+json."""

    async def handle(request: Request, exc: Exception) -> JSONResponse:
        return problem_response(_map(exc), request)

    async def handle_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        titles = {404: "Not found", 405: "Method not allowed", 413: "Request too large"}
        detail = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"there is no route {request.method} {request.url.path}; see /docs"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method of the path, not only its first route's
            headers["Allow"] = ", ".join(_allowed_methods(request))
        problem = Problem(exc.status_code, f"http-{exc.status_code}",
                          titles.get(exc.status_code, "HTTP error"), detail, headers=headers)
        return problem_response(problem, request)

    async def handle_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return problem_response(_validation_problem(exc), request)

    app.add_exception_handler(StarletteHTTPException, handle_http)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, handle_validation)  # type: ignore[arg-type]
    for cls in (Problem, ServiceError, ArgumentsInvalid, SessionError, Overloaded):
        app.add_exception_handler(cls, handle)
    app.add_exception_handler(Exception, handle)  # last resort: 500 without internals
