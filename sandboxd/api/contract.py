"""The OpenAPI document, made true: every error status an operation can answer is documented
as ``application/problem+json`` (RFC 9457), ``/metrics`` is text, ``/readyz`` may be 503, and
the bearer scheme is declared when (and only when) a tokens file is configured."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from sandboxd.api.problems import MEDIA_TYPE

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem details; extension members depend on the problem type",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
    },
    "additionalProperties": True,
}

WHEN: dict[int, str] = {
    400: "The body is not JSON",
    401: "Missing or unknown bearer token",
    403: "The policy refuses the workspace path (its file rules, a symlink, '..')",
    404: "Unknown tool, session or route",
    408: "A file upload did not arrive within the call's time limit",
    409: "Too many sessions for the client, the session workspace is over its quota, or (a "
         "file endpoint) the path is a directory or passes through a file",
    413: "Request body over max_body_bytes (a file upload: over the policy's max_bytes)",
    422: "The body or the tool arguments do not match their schema",
    429: "Queue full, waited too long for a slot, over the client's rate limit, or (a "
         "session python call) the host's live kernels at max_kernels",
    500: "Unexpected failure, or the audit log cannot be written",
    503: "Shutting down, the tool's backend is unavailable, or the host is full (its memory "
         "headroom below the reserve, or every sandbox uid in use: `full` names which)",
    507: "The state directory or the audit log's filesystem is full",
}

#: statuses every operation may answer / those of authenticated operations / with a body
ALWAYS = (404, 500)
AUTHENTICATED = (401, 429)
WITH_BODY = (400, 413, 422)
EXTRA: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/v1/tools/{name}/invoke"): (409, 503, 507),
    ("post", "/v1/sessions"): (409, 503, 507),
    ("post", "/v1/sessions/{session_id}/fork"): (409, 503, 507),
    ("post", "/v1/sessions/{session_id}/tools/{name}/invoke"): (409, 503, 507),
    ("get", "/v1/tools"): (422,),
    ("put", "/v1/sessions/{session_id}/files/{path}"): (403, 408, 409, 503, 507),
    ("get", "/v1/sessions/{session_id}/files/{path}"): (403, 409, 422, 503, 507),
}
TEXT_PLAIN = {"text/plain": {"schema": {"type": "string"}}}


def install(app: FastAPI, *, tokens: bool) -> None:
    """Replace ``app.openapi`` by the generator of the corrected document."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            app.openapi_schema = correct(schema, tokens=tokens)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def correct(schema: dict[str, Any], *, tokens: bool) -> dict[str, Any]:
    """The document FastAPI generates, with the corrections described in the module doc."""
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Problem"] = PROBLEM_SCHEMA
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    if tokens:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, operations in schema.get("paths", {}).items():
        for method, op in operations.items():
            _correct_operation(path, method, op, tokens=tokens)
    ready = schema["paths"]["/readyz"]["get"]["responses"]
    ready["503"] = {"description": "Not ready: the state names what is broken",
                    "content": {"application/json": {"schema": {"type": "object"}}}}
    schema["paths"]["/metrics"]["get"]["responses"]["200"] = {
        "description": "Prometheus text exposition format", "content": TEXT_PLAIN}
    return schema


def _correct_operation(path: str, method: str, op: dict[str, Any], *, tokens: bool) -> None:
    """One operation's problem responses: those of every route and its own, the token's on
    ``/v1/`` (and its security requirement), the body's and the parameters' (422)."""
    responses = op.setdefault("responses", {})
    statuses = set(ALWAYS) | set(EXTRA.get((method, path), ()))
    if path.startswith("/v1/"):
        statuses |= set(AUTHENTICATED)
        if tokens:
            op["security"] = [{"bearer": []}]
    if method in ("post", "put", "patch"):
        statuses |= set(WITH_BODY)
    if op.get("parameters"):
        statuses.add(422)
    for status in sorted(statuses):
        responses[str(status)] = _problem(status)


def _problem(status: int) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": WHEN[status],
        "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }
    if status in (429, 503):
        response["headers"] = {"Retry-After": {"description": "Seconds to wait",
                                               "schema": {"type": "string"}}}
    return response
