"""What MCP shows of sandboxd's tools and results: a tool as ``tools/list`` lists it, a
sandboxd result (or a refusal) as the answer to ``tools/call`` (docs/mcp.md, "Mapping")."""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types.version import is_version_at_least

from sandboxd.api.mcp import handles as mcp_handles
from sandboxd.api.problems import McpAnswer
from sandboxd.errors import SandboxdError
from sandboxd.models import Result, Status, ToolSpec
from sandboxd_client.render import result_parts

#: every tool's ``outputSchema``: its ``structuredContent`` is the whole sandboxd result
RESULT_SCHEMA: dict[str, Any] = Result.model_json_schema(mode="serialization")


def tool_for(spec: ToolSpec, handle: bool = False) -> types.Tool:
    """A sandboxd tool as MCP lists it: title, annotations (what it does to its sandbox; no
    network: not open-world), the result's schema, availability in ``_meta`` (as
    ``GET /v1/tools`` says). ``handle``: with the stateless revision's ``session`` argument."""
    meta: dict[str, Any] = {"sandboxd/backend": spec.backend, "sandboxd/available": spec.available}
    if spec.unavailable_reason:
        meta["sandboxd/unavailable_reason"] = spec.unavailable_reason
    hints = spec.annotations
    annotations = types.ToolAnnotations(
        title=spec.title, read_only_hint=hints.get("readOnlyHint"),
        destructive_hint=hints.get("destructiveHint"),
        idempotent_hint=hints.get("idempotentHint"), open_world_hint=hints.get("openWorldHint"))
    return types.Tool(name=spec.name, title=spec.title, description=spec.description,
                      input_schema=(mcp_handles.with_handle(spec.parameters) if handle
                                    else spec.parameters), output_schema=RESULT_SCHEMA,
                      annotations=annotations, meta=meta)


def call_result(result: Result) -> types.CallToolResult:
    """A sandboxd result as the answer to ``tools/call``: text and image content in execution
    order (:func:`~sandboxd_client.render.result_parts`), each image after the text that
    names it."""
    content: list[types.ContentBlock] = []
    for part in result_parts(result):
        if isinstance(part, str):
            content.append(types.TextContent(text=part))
        elif part.image:
            content.append(types.ImageContent(type="image", data=part.image[1],
                                              mime_type=part.image[0]))
    return types.CallToolResult(content=content,
                                structured_content=result.wire(),
                                is_error=result.status is not Status.ok)


def error_result(message: str, result: Result | None = None) -> types.CallToolResult:
    """A call the service refused after the arguments were fine (busy, draining, storage full,
    audit log unwritable...): an error result the model can read, not a protocol error."""
    if result is not None:
        answer = call_result(result)
        answer.content.insert(0, types.TextContent(text=message))
        answer.is_error = True
        return answer
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


def named_result(answer: types.CallToolResult, sid: str | None) -> types.CallToolResult:
    """A stateless call's answer, its last text block naming the session to pass back."""
    if sid is not None:
        answer.content.append(types.TextContent(text=mcp_handles.note(sid)))
    return answer


def problem_answer(exc: SandboxdError, answer: McpAnswer, version: str,
                   named: str | None) -> types.CallToolResult:
    """A call that ended in ``exc``, answered as its row of the outcome table says: a
    JSON-RPC error (raised, for the SDK to send), or a tool error the model reads (naming
    the stateless call's session ``named`` unless the row says it names none)."""
    code = _rpc_code(answer, version)
    if code is not None:
        raise MCPError(code, str(exc),
                       {key: getattr(exc, attr) for key, attr in answer.data} or None)
    text = answer.says.format(exc=exc, retry=max(1, getattr(exc, "retry_after", 1)))
    audited: Result | None = getattr(exc, "result", None) if answer.shows_result else None
    return named_result(error_result(text, audited), named if answer.names_session else None)


def _rpc_code(answer: McpAnswer, version: str) -> int | None:
    """The JSON-RPC error the row answers with at this protocol revision (``None``: a tool
    error, from the row's ``rpc_until`` revision on or when it has no JSON-RPC error)."""
    if answer.rpc_until is not None and is_version_at_least(version, answer.rpc_until):
        return None
    return answer.rpc
