"""Binary content on the client side: the raw file endpoints' request bodies and the base64
forms of ``read_file`` / ``write_file``."""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, BinaryIO
from urllib.parse import quote

from sandboxd_client.models import Result

CHUNK = 256 * 1024
#: a body: bytes, or a factory of a fresh chunk iterator (called again on a retry)
Body = bytes | Callable[[], Iterator[bytes]] | Callable[[], AsyncIterator[bytes]]


def file_url(session: str, path: str) -> str:
    """The endpoint of a workspace file; each path component is quoted on its own (a ``/``
    separates directories; ``.``/``..`` are sent encoded, so they never reach another
    route: the daemon sees them and refuses them)."""
    parts = "/".join(p.replace(".", "%2E") if p in (".", "..") else quote(p, safe="")
                     for p in str(path).split("/"))  # ".." travels encoded: the daemon refuses it
    return f"/v1/sessions/{quote(str(session), safe='')}/files/{parts}"


def _size(fh: BinaryIO) -> int | None:
    try:
        here = fh.tell()
        end = fh.seek(0, os.SEEK_END)
        fh.seek(here)
        return end - here
    except (OSError, ValueError, AttributeError):
        return None


def upload_body(data: bytes | bytearray | memoryview | BinaryIO, *,
                asynchronous: bool = False) -> tuple[Body, dict[str, str]]:
    """The content and headers of a ``PUT``: bytes as they are, a binary file read in
    :data:`CHUNK` pieces from where it stands (rewound there on a retry), with its
    ``Content-Length`` when it can be told (the daemon then refuses an oversized upload
    before anything is sent)."""
    headers = {"Content-Type": "application/octet-stream"}
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data), headers
    fh = data
    if not hasattr(fh, "read"):
        raise TypeError("upload() takes bytes or a binary file object")
    size = _size(fh)
    start = fh.tell() if size is not None else None
    if size is not None:
        headers["Content-Length"] = str(size)

    def rewind() -> None:
        if start is not None:
            fh.seek(start)

    def chunks() -> Iterator[bytes]:
        rewind()
        while block := fh.read(CHUNK):
            if not isinstance(block, bytes):
                raise TypeError("upload() needs a file opened in binary mode")
            yield block

    async def achunks() -> AsyncIterator[bytes]:
        for block in chunks():
            yield block

    return (achunks if asynchronous else chunks), headers


def write_arguments(path: str, content: str | bytes | bytearray) -> dict[str, Any]:
    """The write_file arguments for text, or for bytes (base64)."""
    if isinstance(content, bytes | bytearray):
        return {"path": path, "content": base64.b64encode(content).decode("ascii"),
                "encoding": "base64"}
    if not isinstance(content, str):
        raise TypeError(f"write_file content must be str or bytes, not {type(content).__name__}")
    return {"path": path, "content": content}


def read_arguments(path: str, encoding: str) -> dict[str, Any]:
    """The read_file arguments (``encoding`` is ``utf-8`` or ``base64``)."""
    if encoding not in ("utf-8", "base64"):
        raise ValueError("encoding must be 'utf-8' or 'base64'")
    return {"path": path} if encoding == "utf-8" else {"path": path, "encoding": "base64"}


def decoded(result: Result) -> bytes:
    """The bytes of a successful ``read_file`` with ``encoding: "base64"``."""
    return base64.b64decode(result.stdout, validate=True)
