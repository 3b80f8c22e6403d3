"""Raw file transfers: the bytes of the ``PUT``/``GET /v1/sessions/{id}/files/{path}``
endpoints (:mod:`sandboxd.api.files`), which are calls of the ``write_file`` / ``read_file``
tools. This module knows nothing of the service: the endpoints make the call, the workspace
backend moves the bytes (layers point one way: api -> service -> backends -> this).

An upload or a download is one ordinary call through :meth:`Sandboxd.invoke` (tool lookup,
policy decision with the file rules and ``max_bytes``, audit ``decision`` and ``result``
records, the workspace backend's descriptor-walking confinement, the session quota), with a
:class:`Transfer` attached: it carries the request body in; the file's content comes out as
the result's ``body`` (never serialised: not on the wire, not in the audit log). Only the
way the bytes travel differs from the JSON tools, so there is no second set of rules to keep
in step.

A transfer waits on the network, not on a sandbox: it never takes an execution slot, only one
of its client's own transfer slots (``transfer_slots_per_client``), and an upload's body is
received on the event loop (no thread waits for it). An upload must keep up an average of
``transfer_min_rate_bytes_s`` once ``transfer_rate_grace_s`` have passed, and must arrive
within the ``write_file`` time limit; else it ends with 408 and nothing is written. A download
is read whole (at most ``max_bytes``) within the call and sent after it: a slow reader holds
no slot at all.

The arguments audited and decided on describe the transfer (``{"path": ..., "transfer":
"upload", "declared_bytes": ...}``); they are made by the daemon, not by a model, so they are
not checked against the tool's JSON schema.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from typing import Literal

from sandboxd.errors import SandboxdError
from sandboxd.util.deadline import within

#: the endpoint of a workspace file (``{session}`` and ``{path}`` filled in)
FILES_ROUTE = "/v1/sessions/{session}/files/{path}"


class UploadAborted(SandboxdError):
    """The client went away before the whole upload arrived (nothing is written)."""

    code = "upload-aborted"


class UploadTimedOut(UploadAborted):
    """The upload did not arrive within the call's time limit (nothing is written)."""

    code = "upload-timeout"


class UploadTooSlow(UploadTimedOut):
    """The upload fell under the minimum rate (nothing is written): also a 408."""


def binary_hint(path: str, session: str | None) -> str:
    """How to fetch a file that is not text: what ``read_file`` tells a model."""
    where = FILES_ROUTE.format(session=session or "{session}", path=path)
    return (f'read it with read_file and "encoding": "base64", or download the raw bytes '
            f"with GET {where}")


class Transfer:
    """The bytes of one upload (``body``: the request body, received by :meth:`chunks`), or
    the mark of one download (the file's content comes back as the result's ``body``)."""

    def __init__(self, direction: Literal["upload", "download"],
                 body: AsyncIterator[bytes] | None = None, declared: int | None = None, *,
                 min_rate: int = 0, grace_s: float = 0.0) -> None:
        self.direction = direction
        self.declared = declared  # Content-Length of an upload, when the client sent one
        self.received = 0
        self.min_rate = min_rate  # bytes/s on average after grace_s (0: no minimum)
        self.grace_s = grace_s
        self._body = body

    def rate_due(self, began: float) -> float:
        """When the next piece must have come for the upload to keep its minimum rate:
        ``received >= min_rate * (elapsed - grace_s)`` at every moment (monotonic)."""
        if self.min_rate <= 0:
            return math.inf
        return began + self.grace_s + self.received / self.min_rate

    async def _next(self) -> bytes:
        assert self._body is not None
        async for chunk in self._body:
            if chunk:
                return chunk
        return b""

    async def chunks(self, deadline: float) -> AsyncIterator[bytes]:
        """The upload's pieces as they arrive, on the event loop; :class:`UploadTooSlow`
        under the minimum rate, :class:`UploadTimedOut` past ``deadline`` (monotonic)."""
        began = time.monotonic()
        while True:
            rate_due = self.rate_due(began)
            got, chunk = await within(self._next(), min(rate_due, deadline) - time.monotonic())
            if not got:
                came = f"{self.received} bytes came in {time.monotonic() - began:.1f} s"
                if rate_due < deadline:
                    raise UploadTooSlow(
                        f"the upload is slower than the minimum of {self.min_rate} bytes/s "
                        f"(after the first {self.grace_s:g} s; {came}); nothing was written")
                raise UploadTimedOut(f"the upload did not arrive within the call's time limit "
                                     f"({came}); nothing was written")
            if not chunk:
                return
            self.received += len(chunk)
            yield chunk
