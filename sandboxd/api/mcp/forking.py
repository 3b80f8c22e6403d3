"""The MCP door's ``fork_session`` tool: ``POST /v1/sessions/{id}/fork`` for a model.

A model that wants to try several things from one point (its files and its Python variables)
forks its session and goes on in each fork with the fork's id as the tools' ``session``
argument (the stateless revision's handle, or ``_meta`` in the handshake era). It is the
service's one fork operation (:func:`sandboxd.fork.fork_session`: the caller's session only,
counted against its sessions, audited with ``transport: mcp``); the answer is its JSON as
``structuredContent`` and a line a model reads. A policy tool of the same name keeps it.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types

from sandboxd.errors import ServiceError
from sandboxd.fork import MAX_FORKS, fork_session
from sandboxd.service import Sandboxd
from sandboxd.sessions.manager import SessionError

NAME = "fork_session"
_SESSIONS_OUT = {"type": "array", "items": {"type": "object"}}
TOOL = types.Tool(
    name=NAME,
    title="Fork a session",
    description=(
        "Make `count` new sessions that start where `session` is now: a copy of its files "
        "and, when its Python kernel can carry it, its live Python variables, functions and "
        "imports (the answer's kernel.not_carried names what could not come). Each fork is a "
        "sandbox of its own; pass a fork's id as `session` to go on in it. The forks count "
        "against your sessions."),
    input_schema={
        "type": "object",
        "properties": {
            "session": {"type": "string", "description": "The session to fork (its id)."},
            "count": {"type": "integer", "minimum": 1, "maximum": MAX_FORKS, "default": 1,
                      "description": "How many forks to make."},
        },
        "required": ["session"],
        "additionalProperties": False,
    },
    output_schema={
        "type": "object",
        "properties": {
            "parent": {"type": "string"},
            "sessions": _SESSIONS_OUT,
            "files": {"type": "array", "items": {"type": "object"}},
            "kernel": {"type": "object", "properties": {
                "carried": {"type": "boolean"}, "reason": {"type": "string"},
                "bytes": {"type": "integer"},
                "not_carried": {"type": "array", "items": {"type": "object", "properties": {
                    "name": {"type": "string"}, "why": {"type": "string"}}}}},
                "required": ["carried"]},
        },
        "required": ["parent", "sessions", "files", "kernel"],
    },
    annotations=types.ToolAnnotations(
        title="Fork a session", read_only_hint=False, destructive_hint=False,
        idempotent_hint=False, open_world_hint=False),
)


class BadArguments(ValueError):
    """The tool's arguments break its input schema (``field``: which)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{NAME}: {field} {problem}")
        self.field = field
        self.problem = problem


def arguments(given: dict[str, Any]) -> tuple[str, int]:
    """``(session, count)`` from the call's arguments, checked against the input schema."""
    extra = sorted(set(given) - {"session", "count"})
    if extra:
        raise BadArguments(extra[0], "is not an argument of this tool")
    sid, count = given.get("session"), given.get("count", 1)
    if not isinstance(sid, str) or not sid:
        raise BadArguments("session", "must be a session id (a string a result named)")
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_FORKS:
        raise BadArguments("count", f"must be a whole number from 1 to {MAX_FORKS}")
    return sid, count


def summary(made: dict[str, Any]) -> str:
    """What a model reads: the forks' ids and what came with them."""
    ids = ", ".join(s["id"] for s in made["sessions"])
    kernel = made["kernel"]
    said = [f"forked {made['parent']} into {ids}."]
    if kernel["carried"]:
        said.append("Its Python state came along.")
    else:
        said.append(f"Its Python state did not: {kernel.get('reason')}.")
    for left in kernel.get("not_carried", []):
        said.append(f"Not carried: {left['name']} ({left['why']}).")
    said.append('Pass a fork\'s id as "session" to go on in it.')
    return " ".join(said)


async def call(service: Sandboxd, client: str, given: dict[str, Any],
               transport: str) -> types.CallToolResult:
    """Fork the caller's session; a refusal (not its session, too many sessions, draining)
    is an error result saying that nothing was made."""
    sid, count = arguments(given)
    try:
        made = await fork_session(service, client, sid, count, transport=transport)
    except (ServiceError, SessionError) as exc:
        return types.CallToolResult(
            content=[types.TextContent(text=f"nothing was forked: {exc}")], is_error=True)
    made = json.loads(json.dumps(made, default=str))  # plain JSON, as the HTTP answer
    return types.CallToolResult(content=[types.TextContent(text=summary(made))],
                                structured_content=made, is_error=False)
