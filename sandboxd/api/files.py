"""The raw file endpoints of a session workspace (binary content, no base64):

* ``PUT /v1/sessions/{session_id}/files/{path}``: the request body (``application/octet-stream``)
  becomes the file, streamed in bounded chunks into a temporary file renamed into place;
* ``GET /v1/sessions/{session_id}/files/{path}``: the file's bytes, as an attachment.

Both are calls of the ``write_file`` / ``read_file`` tools (:func:`upload`, :func:`download`;
the bytes travel in a :class:`~sandboxd.workspaces.transfer.Transfer`): the same
path rules, policy decision, size cap, quota and audit records. The request body limit of the
JSON API (``max_body_bytes``) does not apply to the upload: the policy's ``max_bytes`` does.
"""

from __future__ import annotations

import mimetypes
import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Request, Response
from starlette.requests import ClientDisconnect
from starlette.types import Scope

from sandboxd.api.auth import authenticate
from sandboxd.api.problems import PROBLEMS, coded
from sandboxd.backends.workspace_errors import RefusedPath
from sandboxd.models import InvokeRequest, Result, Status
from sandboxd.service import Sandboxd
from sandboxd.workspaces.transfer import Transfer, UploadAborted

router = APIRouter()
ROUTE = "/v1/sessions/{session_id}/files/{path:path}"
_UPLOAD = re.compile(r"^/v1/sessions/[^/]+/files/")
BINARY = {"schema": {"type": "string", "format": "binary"}}
#: what a browser must never do with a file a sandbox wrote: render it, sniff it, run it
DOWNLOAD_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
                    "Content-Security-Policy": "default-src 'none'; sandbox"}


def bounds_own_body(scope: Scope) -> bool:
    """Whether the request is an upload, whose body the route bounds itself (by the policy's
    ``max_bytes`` and the session quota) instead of the API's ``max_body_bytes``."""
    return scope.get("method") == "PUT" and bool(_UPLOAD.match(scope.get("path", "")))


async def _body(request: Request) -> AsyncIterator[bytes]:
    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect:
        raise UploadAborted("the client closed the connection during the upload") from None


@router.put(ROUTE, tags=["files"], response_model=Result, openapi_extra={
    "requestBody": {"required": True, "content": {"application/octet-stream": BINARY}}})
async def put_file(session_id: str, path: str, request: Request,
                   client: str = Depends(authenticate)) -> Response:
    """Create or replace a workspace file with the raw request body (the write_file tool)."""
    length = request.headers.get("content-length", "")
    declared = int(length) if length.isdigit() else None
    result = await upload(request.app.state.service, client, session_id, path,
                          _body(request), declared)
    _raise_for(result)
    return Response(result.wire_json(), media_type="application/json")


@router.get(ROUTE, tags=["files"], response_class=Response, responses={200: {
    "description": "The file's bytes; Content-Type guessed from the name, without a charset "
                   "(the bytes are the file's, whatever their encoding), else "
                   "application/octet-stream",
    "content": {"*/*": {}}}})  # no schema: the bytes are the file's, whatever they are
async def get_file(session_id: str, path: str, request: Request,
                   client: str = Depends(authenticate)) -> Response:
    """The raw bytes of a workspace file (the read_file tool), as an attachment."""
    result = await download(request.app.state.service, client, session_id, path)
    _raise_for(result)
    assert result.body is not None
    name = path.rstrip("/").rsplit("/", 1)[-1] or "file"
    media = mimetypes.guess_type(name)[0] or "application/octet-stream"
    # set as a header, not media_type: Starlette would add "charset=utf-8" to a text/* type
    headers = {**DOWNLOAD_HEADERS, "Content-Type": media, "X-Sandboxd-Request-Id": result.id,
               "Content-Disposition": f"attachment; filename*=UTF-8''{quote(name, safe='')}"}
    return Response(result.body, headers=headers)


def _raise_for(result: Result) -> None:
    """A failed transfer as problem+json from the one table: denied or refused path 403, too
    large 413, over quota 409, a directory or a path through a file 409, missing 404, an
    upload under the minimum rate or past the call's time limit 408, any other failure of
    the file 422."""
    if result.status is Status.ok:
        return
    extra: dict[str, Any] = {"request_id": result.id}
    if result.policy is not None:
        extra["rule"] = result.policy.rule
    detail = result.message or result.stderr or str(result.status)
    raise coded(_failure_code(result), detail, **extra)


def _failure_code(result: Result) -> str:
    """The problem table's code of a transfer that failed."""
    if result.status in (Status.denied, Status.rejected):
        return RefusedPath.code  # the policy's file rules, or the confinement
    if result.problem is None:
        return "execution-failure"  # stopped before the file operation (a limit, a cancel)
    return result.problem if result.problem in PROBLEMS else "file-tool-error"


async def upload(service: Sandboxd, client: str, session_id: str, path: str,
                 body: AsyncIterator[bytes], declared: int | None, *,
                 transport: str = "http") -> Result:
    """Create or replace ``path`` in the client's session from ``body`` (the write_file tool
    with the bytes streamed); another client's session is :class:`SessionNotFound`."""
    service.session(client, session_id)
    settings = service.settings
    transfer = Transfer("upload", body, declared, min_rate=settings.transfer_min_rate_bytes_s,
                        grace_s=settings.transfer_rate_grace_s)
    arguments: dict[str, object] = {"path": path, "transfer": "upload",
                                    "declared_bytes": declared}
    return await service.invoke(client, "write_file",
                                InvokeRequest(arguments=arguments, session=session_id),
                                transport=transport, transfer=transfer)


async def download(service: Sandboxd, client: str, session_id: str, path: str, *,
                   transport: str = "http") -> Result:
    """The bytes of ``path`` in the client's session (the read_file tool, raw): the result's
    ``body`` when it is ``ok``."""
    service.session(client, session_id)
    arguments: dict[str, object] = {"path": path, "transfer": "download"}
    return await service.invoke(client, "read_file",
                                InvokeRequest(arguments=arguments, session=session_id),
                                transport=transport, transfer=Transfer("download"))
