"""The JSON-RPC envelope of a ``POST /mcp`` message, checked before the MCP SDK reads it.

The SDK takes a message whose ``id`` is not a string or an integer (``null``, ``true``,
``1.5``, an object) for a notification: it answers ``202 Accepted`` and the caller waits for
an answer that never comes. Its other envelope errors are a ``-32602`` with pydantic's
validation dump. Here every such message is answered at once with one clear ``-32600 Invalid
Request`` (HTTP 400) that echoes the ``id`` when it is a valid one (JSON-RPC 2.0 section 5:
``null`` when it could not be read). A body that is not JSON is left to the SDK (``-32700``).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Message, Receive, Send

__all__ = ["INVALID_REQUEST", "envelope_error", "replay_body", "request_id", "rpc_error",
           "with_request_id"]
INVALID_REQUEST = -32600  # JSON-RPC 2.0 section 5.1 (no SDK import for a constant)
PARSE_ERROR = -32700


def rpc_error(ident: str | int | None, code: int, message: str,
              data: Any = None) -> dict[str, Any]:
    """A JSON-RPC 2.0 error response."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": ident, "error": error}


def _valid_id(value: object) -> str | int | None:
    """``value`` when it is a valid JSON-RPC id (a string or an integer), else ``None``."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return None


def _parse(body: bytes) -> object:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser
        return None


def request_id(body: bytes) -> str | int | None:
    """The ``id`` of the message in ``body`` when it has a valid one (else ``None``)."""
    message = _parse(body)
    return _valid_id(message.get("id")) if isinstance(message, dict) else None


def envelope_error(body: bytes) -> dict[str, Any] | None:
    """The error answer for a message that is not one JSON-RPC 2.0 message as MCP has them,
    or ``None`` when the SDK should read it (valid, or not JSON at all: blank included)."""
    message = _parse(body)
    if message is None:
        return None  # the SDK's parse error (-32700)
    if isinstance(message, list):
        return _invalid(None, "a JSON-RPC batch (an array) is not served; send one message "
                              "per request")
    if not isinstance(message, dict):
        return _invalid(None, "a JSON-RPC message is a JSON object")
    echo = _valid_id(message.get("id"))
    if message.get("jsonrpc") != "2.0":
        return _invalid(echo, 'the message must have "jsonrpc": "2.0"')
    if "method" in message:
        return _request_error(message, echo)
    if "result" in message or "error" in message:
        return None  # a client's answer to a server request: the SDK routes it
    return _invalid(echo, 'a message has a "method" (a request or a notification) or a '
                          '"result" or "error" (a response)')


def _request_error(message: dict[str, Any], echo: str | int | None) -> dict[str, Any] | None:
    """The error answer for a request or a notification (a message with a ``method``) whose
    method, id or params are of the wrong type, else ``None``."""
    if not isinstance(message["method"], str):
        return _invalid(echo, '"method" must be a string')
    if "id" in message and echo is None:
        return _invalid(None, '"id" must be a string or an integer (never null, a '
                              "fraction, a boolean, an array or an object)")
    if "params" in message and not isinstance(message["params"], dict):
        return _invalid(echo, '"params" must be an object')
    return None


def _invalid(ident: str | int | None, why: str) -> dict[str, Any]:
    return rpc_error(ident, INVALID_REQUEST, f"invalid JSON-RPC request: {why}")


def replay_body(body: bytes, receive: Receive) -> Receive:
    """``receive`` with the body, already read to check its envelope, given back first."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def with_request_id(send: Send, ident: str | int | None) -> Send:
    """``send`` of a request with id ``ident``: a JSON-RPC error the SDK answers with
    ``"id": null`` (its transport's own refusals: an unknown or a missing session id...)
    gets the request's id, as JSON-RPC 2.0 section 5 wants (``null`` only when the id could not
    be read: a parse error keeps it). Other answers pass through untouched."""
    if ident is None:
        return send
    start: Message | None = None
    chunks: list[bytes] = []

    async def wrapped(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start":
            kinds = dict(message.get("headers", []))
            if message["status"] >= 400 and kinds.get(b"content-type", b"").startswith(
                    b"application/json"):
                start = message  # the body decides: held until it is whole
                return
        elif start is not None and message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = _with_id(b"".join(chunks), ident)
            headers = [(k, v) for k, v in start.get("headers", []) if k != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        await send(message)

    return wrapped


def _with_id(body: bytes, ident: str | int) -> bytes:
    answer = _parse(body)
    error = answer.get("error") if isinstance(answer, dict) else None
    # a parse error keeps null (section 5: the message was not read, whatever this check read)
    if (isinstance(answer, dict) and isinstance(error, dict) and answer.get("id") is None
            and error.get("code") != PARSE_ERROR):
        return json.dumps({**answer, "id": ident}, separators=(",", ":")).encode()
    return body
