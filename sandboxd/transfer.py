"""Raw file transfers: the ``PUT``/``GET /v1/sessions/{id}/files/{path}`` endpoints as calls of
the ``write_file`` / ``read_file`` tools.

An upload or a download is one ordinary call through :meth:`Sandboxd.invoke` (tool lookup,
policy decision with the file rules and ``max_bytes``, audit ``decision`` and ``result``
records, scheduler slot, the workspace backend's descriptor-walking confinement, the session
quota), with a :class:`Transfer` attached that carries the bytes: the request body in, the
file's content out. Only the way the bytes travel differs from the JSON tools, so there is no
second set of rules to keep in step.

The arguments audited and decided on describe the transfer (``{"path": ..., "transfer":
"upload", "declared_bytes": ...}``); they are made by the daemon, not by a model, so they are
not checked against the tool's JSON schema.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Literal

from sandboxd.models import InvokeRequest, Result

if TYPE_CHECKING:
    from sandboxd.service import Sandboxd

#: the endpoint of a workspace file (``{session}`` and ``{path}`` filled in)
FILES_ROUTE = "/v1/sessions/{session}/files/{path}"
#: the largest piece of an upload held in memory at once
CHUNK_BYTES = 256 * 1024


class UploadAborted(Exception):
    """The client went away before the whole upload arrived (nothing is written)."""


class UploadTimedOut(UploadAborted):
    """The upload did not arrive within the call's time limit (nothing is written)."""


def binary_hint(path: str, session: str | None) -> str:
    """How to fetch a file that is not text: what ``read_file`` tells a model."""
    where = FILES_ROUTE.format(session=session or "{session}", path=path)
    return (f'read it with read_file and "encoding": "base64", or download the raw bytes '
            f"with GET {where}")


class Transfer:
    """The bytes of one upload (``body``: the request body, read in bounded chunks from the
    backend's thread) or one download (``data``: the file's content, set by the backend)."""

    def __init__(self, direction: Literal["upload", "download"],
                 body: AsyncIterator[bytes] | None = None, declared: int | None = None) -> None:
        self.direction = direction
        self.declared = declared  # Content-Length of an upload, when the client sent one
        self.data: bytes | None = None
        self.problem: Exception | None = None  # why the backend refused it, when it did
        self.received = 0
        self.deadline: float | None = None  # monotonic; the call's, set by the backend
        self._body = body
        self._pending = b""
        self._loop = asyncio.get_running_loop()

    async def _next(self) -> bytes:
        assert self._body is not None
        async for chunk in self._body:
            if chunk:
                return chunk
        return b""

    def next_chunk(self) -> bytes:
        """The next piece of the upload (at most :data:`CHUNK_BYTES`), ``b""`` at its end.
        Called from a worker thread: the body is read on the event loop."""
        if not self._pending:
            future = asyncio.run_coroutine_threadsafe(self._next(), self._loop)
            wait = None if self.deadline is None else max(self.deadline - time.monotonic(), 0)
            try:
                self._pending = future.result(wait)
            except concurrent.futures.TimeoutError:
                future.cancel()
                raise UploadTimedOut(
                    f"the upload did not arrive within the call's time limit ({self.received} "
                    "bytes came); nothing was written") from None
        chunk, self._pending = self._pending[:CHUNK_BYTES], self._pending[CHUNK_BYTES:]
        self.received += len(chunk)
        return chunk


async def upload(service: Sandboxd, client: str, session_id: str, path: str,
                 body: AsyncIterator[bytes], declared: int | None, *,
                 transport: str = "http") -> tuple[Result, Transfer]:
    """Create or replace ``path`` in the client's session from ``body`` (the write_file tool
    with the bytes streamed); another client's session is :class:`SessionNotFound`."""
    service.session(client, session_id)
    transfer = Transfer("upload", body, declared)
    arguments: dict[str, object] = {"path": path, "transfer": "upload",
                                    "declared_bytes": declared}
    result = await service.invoke(client, "write_file",
                                  InvokeRequest(arguments=arguments, session=session_id),
                                  transport=transport, transfer=transfer)
    return result, transfer


async def download(service: Sandboxd, client: str, session_id: str, path: str, *,
                   transport: str = "http") -> tuple[Result, Transfer]:
    """The bytes of ``path`` in the client's session (the read_file tool, raw)."""
    service.session(client, session_id)
    transfer = Transfer("download")
    arguments: dict[str, object] = {"path": path, "transfer": "download"}
    result = await service.invoke(client, "read_file",
                                  InvokeRequest(arguments=arguments, session=session_id),
                                  transport=transport, transfer=transfer)
    return result, transfer
