"""The Connect protocol (connectrpc.com/docs/protocol), JSON codec, as envd speaks it to the
E2B SDKs: unary calls are a JSON body in and out; a server stream is a request envelope in
and envelopes out (a flags byte, a 4-byte big-endian length, the JSON), ended by an
end-of-stream envelope that carries the error, if any.
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sandboxd.api.problems import problem_body

STREAM_TYPE = "application/connect+json"
END_STREAM = 0x02
MAX_MESSAGE = 16 * 1024 * 1024
#: Connect's error codes by the HTTP status of sandboxd's problems
CODES = {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied",
         404: "not_found", 408: "deadline_exceeded", 409: "failed_precondition",
         413: "resource_exhausted", 422: "invalid_argument", 429: "resource_exhausted",
         499: "canceled", 501: "unimplemented", 503: "unavailable", 504: "deadline_exceeded",
         507: "resource_exhausted"}
#: the HTTP status of a unary call's error, by Connect code (the protocol's table)
STATUSES = {"invalid_argument": 400, "unauthenticated": 401, "permission_denied": 403,
            "not_found": 404, "failed_precondition": 400, "resource_exhausted": 429,
            "canceled": 499, "unimplemented": 501, "unavailable": 503,
            "deadline_exceeded": 504, "internal": 500}


class ConnectError(Exception):
    """An error a Connect call answers with: its code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def error_of(exc: BaseException) -> ConnectError:
    """Any failure as a Connect error (sandboxd's problems keep their message)."""
    if isinstance(exc, ConnectError):
        return exc
    body = problem_body(exc)
    status = int(body.get("status", 500))
    return ConnectError(CODES.get(status, "internal"), str(body.get("detail", "failed")))


def unary_error(exc: BaseException) -> Response:
    err = error_of(exc)
    return JSONResponse({"code": err.code, "message": err.message},
                        status_code=STATUSES.get(err.code, 500))


async def unary_request(request: Request) -> dict[str, Any]:
    """A unary call's JSON message."""
    return _message(await _body(request))


async def stream_request(request: Request) -> dict[str, Any]:
    """A server-stream call's one request message (its envelope unwrapped)."""
    body = await _body(request)
    if len(body) < 5:
        raise ConnectError("invalid_argument", "the request has no envelope")
    flags, size = struct.unpack(">BI", body[:5])
    if flags & 0x01:
        raise ConnectError("unimplemented", "compressed messages are not served")
    return _message(body[5:5 + size])


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def end_of_stream(exc: BaseException | None = None) -> bytes:
    if exc is None:
        return envelope({}, END_STREAM)
    err = error_of(exc)
    return envelope({"error": {"code": err.code, "message": err.message}}, END_STREAM)


def stream_response(messages: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(messages, media_type=STREAM_TYPE,
                             headers={"Cache-Control": "no-store"})


def stream_error(exc: BaseException) -> Response:
    """A server stream refused before its first message: only the end of stream."""
    return Response(end_of_stream(exc), media_type=STREAM_TYPE)


async def _body(request: Request) -> bytes:
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_MESSAGE:
            raise ConnectError("resource_exhausted", f"the request is over {MAX_MESSAGE} bytes")
    return bytes(data)


def _message(data: bytes) -> dict[str, Any]:
    if not data.strip():
        return {}
    try:
        message = json.loads(data)
    except ValueError as exc:
        raise ConnectError("invalid_argument", f"the message is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ConnectError("invalid_argument", "the message is not a JSON object")
    return message


def refuse(feature: str) -> ConnectError:
    """An envd method sandboxd does not serve."""
    return ConnectError("unimplemented", f"sandboxd does not serve envd's {feature}")

