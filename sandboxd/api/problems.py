"""RFC 9457 problem details for every HTTP error, with messages a person or a model can act on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sandboxd.errors import UNAVAILABLE_RETRY_S, SandboxdError

PROBLEM_TYPE = "https://sandboxd.dev/problems/"
MEDIA_TYPE = "application/problem+json"
__all__ = ["MCP_ANSWERS", "MEDIA_TYPE", "PROBLEMS", "PROBLEM_TYPE", "UNAVAILABLE_RETRY_S",
           "McpAnswer", "Problem", "coded", "install", "problem_response"]

#: the code of each :class:`~sandboxd.errors.SandboxdError` that leaves over HTTP -> (status,
#: problem type slug, title). Any other error is a 500 "internal" that shows no internals.
PROBLEMS: dict[str, tuple[int, str, str]] = {
    "invalid-arguments": (422, "invalid-arguments", "Invalid tool arguments"),
    "unknown-tool": (404, "unknown-tool", "Unknown tool"),
    "unknown-session": (404, "unknown-session", "Unknown session"),
    "too-many-sessions": (409, "too-many-sessions", "Too many sessions"),
    "session-over-quota": (409, "session-over-quota", "Session workspace over quota"),
    "overloaded": (429, "overloaded", "Too many calls"),
    "too-many-kernels": (429, "too-many-kernels", "Too many session kernels"),
    "too-many-mcp-sessions": (429, "too-many-mcp-sessions", "Too many MCP sessions"),
    "draining": (503, "draining", "Shutting down"),
    "host-full": (503, "host-full", "Host full"),
    "tool-unavailable": (503, "tool-unavailable", "Tool unavailable"),
    "storage-full": (507, "storage-full", "Insufficient storage"),
    "audit-failure": (500, "audit-failure", "Audit log unavailable"),
    "audit-storage-full": (507, "audit-failure", "Audit log unavailable"),
    "execution-failure": (500, "execution-failure", "Execution failed"),
    # the raw file endpoints (sandboxd/api/files.py): why a transfer's file operation failed
    "path-refused": (403, "path-refused", "Path refused"),
    "file-missing": (404, "file-not-found", "File not found"),
    "is-a-directory": (409, "is-a-directory", "Path is a directory"),
    "not-a-directory": (409, "not-a-directory", "Path passes through a file"),
    "file-not-permitted": (409, "file-not-permitted", "File permissions refuse it"),
    "upload-timeout": (408, "upload-timeout", "Upload too slow"),
    "file-over-quota": (409, "session-over-quota", "Session workspace over quota"),
    "fork-over-quota": (409, "session-over-quota", "Session workspace over quota"),
    "file-too-large": (413, "too-large", "File too large"),
    "file-tool-error": (422, "file-error", "File operation failed"),
    "upload-aborted": (422, "file-error", "File operation failed"),
    # a fleet (docs/fleet.md): the session's node is down (HAProxy answers this
    # one: sandboxd.fleet writes it into its config)
    "node-unavailable": (503, "node-unavailable", "Node unavailable"),
}


#: JSON-RPC 2.0 error codes (section 5.1; no SDK import for a constant)
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
#: from this MCP revision on (SEP-1303), arguments that fail a tool's input schema are a tool
#: execution error (an ``isError`` result the model reads and fixes), no longer a protocol
#: error (-32602) that a host shows no model; an unknown tool stays -32602 in every revision
ARGUMENT_ERRORS_AS_RESULTS = "2025-11-25"


class McpAnswer(NamedTuple):
    """How the MCP door answers a call that ended in a problem, as the MCP spec divides them:
    a request MCP itself cannot serve (an unknown tool) is a JSON-RPC error; a call that
    could not run, or failed, is a tool result with ``isError`` whose text a model reads."""

    counted: str  # the status label of the ``sandboxd_mcp_calls`` counter
    says: str = "nothing ran: {exc}"  # the tool error's text ({retry}: the Retry-After)
    rpc: int | None = None  # a JSON-RPC error of this code instead of a tool error
    rpc_until: str | None = None  # ... only before this protocol revision
    data: tuple[tuple[str, str], ...] = ()  # the JSON-RPC error's data: (key, attribute)
    names_session: bool = True  # a stateless answer still names the session (the handle)
    shows_result: bool = False  # the tool error carries the problem's audited result


_NOTHING_RAN = McpAnswer("error")
#: a file operation's failure: it reaches MCP inside the call's own result (``isError``)
_IN_RESULT = McpAnswer("error", "{exc}")
_AUDIT = McpAnswer("error", "{exc}", shows_result=True)  # the result, when the call ran

#: the MCP answer of each problem of :data:`PROBLEMS` (the same codes: a test holds them in
#: step), so that both doors refuse the same way. A code outside it leaves MCP as the SDK's
#: internal error, as one outside :data:`PROBLEMS` leaves HTTP as a 500.
MCP_ANSWERS: dict[str, McpAnswer] = {
    "invalid-arguments": McpAnswer(
        "invalid_params", "nothing ran: {exc}; fix the arguments and call again",
        rpc=INVALID_PARAMS, rpc_until=ARGUMENT_ERRORS_AS_RESULTS, names_session=False,
        data=(("tool", "tool"), ("field", "field"), ("problem", "detail"))),
    "unknown-tool": McpAnswer("invalid_params", rpc=INVALID_PARAMS,
                              data=(("tool", "tool"), ("available", "available"))),
    "unknown-session": McpAnswer("error", names_session=False),  # the handle names none now
    "too-many-sessions": _NOTHING_RAN,
    "session-over-quota": _NOTHING_RAN,
    "overloaded": McpAnswer("rejected", "sandboxd is busy, nothing ran: {exc}; retry in "
                                        "{retry} s"),
    "too-many-kernels": _NOTHING_RAN,
    # refused before an MCP session opens (:class:`~sandboxd.api.mcp.sessions.McpSessionLimit`)
    "too-many-mcp-sessions": McpAnswer("rejected", rpc=INVALID_REQUEST),
    "draining": _NOTHING_RAN,
    "host-full": _NOTHING_RAN,
    "tool-unavailable": _NOTHING_RAN,
    "storage-full": _NOTHING_RAN,
    "audit-failure": _AUDIT,
    "audit-storage-full": _AUDIT,
    "execution-failure": McpAnswer("error", "{exc}"),  # it may have run in part
    "path-refused": _IN_RESULT,
    "file-missing": _IN_RESULT,
    "is-a-directory": _IN_RESULT,
    "not-a-directory": _IN_RESULT,
    "file-not-permitted": _IN_RESULT,
    "upload-timeout": _IN_RESULT,
    "file-over-quota": _IN_RESULT,
    "fork-over-quota": _NOTHING_RAN,
    "file-too-large": _IN_RESULT,
    "file-tool-error": _IN_RESULT,
    "upload-aborted": _IN_RESULT,
    "node-unavailable": _NOTHING_RAN,  # a fleet's HAProxy answers it, at any door
}


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


def _body(problem: Problem) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE + problem.slug,
        "title": problem.title,
        "status": problem.status,
        "detail": problem.detail,
    }
    body.update(problem.extra)
    return body


def problem_body(exc: BaseException) -> dict[str, Any]:
    """The problem+json object of an error (what a stream's ``error`` event carries)."""
    return _body(_map(exc) if isinstance(exc, Exception) else _map(RuntimeError(str(exc))))


def problem_response(problem: Problem, request: Request | None = None) -> JSONResponse:
    body = _body(problem)
    if request is not None:
        body["instance"] = request.url.path
    return JSONResponse(body, status_code=problem.status, headers=problem.headers,
                        media_type=MEDIA_TYPE)


def coded(code: str, detail: str, **extra: Any) -> Problem:
    """The problem of a table ``code`` (a refusal that reached the API as a result, not as
    a raised error), with its ``detail`` and extra members."""
    status, slug, title = PROBLEMS[code]
    return Problem(status, slug, title, detail, **extra)


def _json_position(body: object, loc: tuple[object, ...]) -> str:
    """``at line L, column C`` of a JSON error's character offset (``loc[1]``) in the body."""
    offset = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
    if offset is None or not isinstance(body, str | bytes):
        return ""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f" at line {line}, column {column}"


def _validation_problem(exc: RequestValidationError, content_type: str = "") -> Problem:
    errors = exc.errors()
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return _invalid_json(exc.body, first)
    if tuple(first.get("loc", ())) == ("body",) and isinstance(first.get("input"), str | bytes):
        return _not_an_object(first, content_type)
    return _invalid_fields(first, errors)


def _invalid_json(body: object, first: dict[str, Any]) -> Problem:
    """The 400 for a body that is not JSON, with where the parser stopped."""
    why = first.get("ctx", {}).get("error", "")
    where = _json_position(body, tuple(first.get("loc", ())))
    return Problem(400, "invalid-json", "Request body is not valid JSON",
                   f"the request body is not valid JSON: {why}{where}".rstrip(": "))


def _not_an_object(first: dict[str, Any], content_type: str) -> Problem:
    """The 422 for a body that is no JSON object at all: most often a client that sent it as
    text (its Content-Type named)."""
    sent = content_type.split(";")[0].strip() or "no Content-Type"
    return Problem(
        422, "invalid-request", "Invalid request",
        f"the request body must be a JSON object sent as application/json (it came as "
        f"{sent}); see /docs for this route's fields", field="(body)",
        errors=[{"field": "", "message": first.get("msg", "invalid request")}])


def _invalid_fields(first: dict[str, Any], errors: Sequence[Any]) -> Problem:
    """The 422 naming the first invalid field, and listing up to 20 of them."""
    field = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "(body)"
    return Problem(
        422, "invalid-request", "Invalid request",
        f"'{field}': {first.get('msg', 'invalid request')}", field=field,
        errors=[{"field": ".".join(str(p) for p in e.get("loc", ()) if p != "body"),
                 "message": e.get("msg", "")} for e in errors[:20]],
    )


def _map(exc: Exception) -> Problem:
    if isinstance(exc, Problem):
        return exc
    row = PROBLEMS.get(exc.code) if isinstance(exc, SandboxdError) else None
    if row is None or not isinstance(exc, SandboxdError):
        return Problem(500, "internal", "Internal error",
                       "an unexpected error happened; the administrator can find it in the "
                       "logs")
    status, slug, title = row
    return Problem(status, slug, title, str(exc), headers=exc.problem_headers(),
                   **exc.problem_fields())


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
        return problem_response(
            _validation_problem(exc, request.headers.get("content-type", "")), request)

    app.add_exception_handler(StarletteHTTPException, handle_http)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, handle_validation)  # type: ignore[arg-type]
    for cls in (Problem, SandboxdError):
        app.add_exception_handler(cls, handle)
    app.add_exception_handler(Exception, handle)  # last resort: 500 without internals
