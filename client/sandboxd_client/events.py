"""Streamed invoke on the client side: ``invoke_stream`` yields a call's output as it is
produced (Server-Sent Events, read with httpx-sse), then its :class:`Result`.

The events (see :mod:`sandboxd.api.events` for the wire): :class:`ToolOutput` for each
``stdout``/``stderr`` chunk and ``display`` item, then the final :class:`Result`. An ``error``
event (the service failed after the call started) raises the same typed error as a plain
invoke would; a refusal before the call runs arrives as problem+json and raises too.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from httpx_sse import EventSource

from sandboxd_client.base import lenient
from sandboxd_client.errors import ConnectionFailed, problem_error, retry_after_seconds
from sandboxd_client.models import Result
from sandboxd_client.output_items import Output

STREAM_HEADERS = {"Accept": "text/event-stream"}


@dataclass(frozen=True)
class ToolOutput:
    """Output of a call while it runs: ``stdout``/``stderr`` text, or a ``display`` item."""

    kind: Literal["stdout", "stderr", "display"]
    text: str = ""
    item: Output | None = None


StreamItem = ToolOutput | Result


class StreamBroken(httpx.HTTPError):
    """The stream ended without its ``result`` event (the connection was cut)."""


def _item(event: str, data: str) -> StreamItem | None:
    """A typed item of one SSE event (``None`` for kinds this client does not know)."""
    payload: Any = json.loads(data)
    if event in ("stdout", "stderr"):
        return ToolOutput(event, text=str(payload.get("text", "")))  # type: ignore[arg-type]
    if event == "display":
        return ToolOutput("display", item=lenient(Output, payload))
    if event == "result":
        return lenient(Result, payload)
    if event == "error":
        raise problem_error(int(payload.get("status", 500)), payload, None)
    return None


def _refused(response: httpx.Response, body: bytes) -> Exception:
    try:
        payload: Any = json.loads(body)
    except ValueError:
        payload = body.decode("utf-8", "replace")
    return problem_error(response.status_code, payload,
                         retry_after_seconds(response.headers.get("Retry-After")))


def _unreachable(http: httpx.Client | httpx.AsyncClient, exc: httpx.TransportError
                 ) -> ConnectionFailed:
    if isinstance(exc, httpx.ConnectError):
        return ConnectionFailed(f"cannot reach sandboxd at {http.base_url}: {exc}")
    return ConnectionFailed(f"connection to sandboxd failed: {exc}")


def iter_stream(http: httpx.Client, path: str, body: dict[str, Any]) -> Iterator[StreamItem]:
    """POST ``body`` asking for events; yield them until the result."""
    try:
        yield from _iter_stream(http, path, body)
    except (httpx.ConnectError, httpx.TimeoutException) as exc:
        raise _unreachable(http, exc) from exc


def _iter_stream(http: httpx.Client, path: str, body: dict[str, Any]) -> Iterator[StreamItem]:
    with http.stream("POST", path, json=body, headers=STREAM_HEADERS) as response:
        if response.status_code >= 400:
            raise _refused(response, response.read())
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            yield lenient(Result, json.loads(response.read()))  # a daemon without streaming
            return
        for sse in EventSource(response).iter_sse():
            item = _item(sse.event, sse.data)
            if item is not None:
                yield item
                if isinstance(item, Result):
                    return
    raise StreamBroken("the stream ended before the call's result")


async def aiter_stream(http: httpx.AsyncClient, path: str,
                       body: dict[str, Any]) -> AsyncIterator[StreamItem]:
    """The async twin of :func:`iter_stream`."""
    try:
        async for item in _aiter_stream(http, path, body):
            yield item
    except (httpx.ConnectError, httpx.TimeoutException) as exc:
        raise _unreachable(http, exc) from exc


async def _aiter_stream(http: httpx.AsyncClient, path: str,
                        body: dict[str, Any]) -> AsyncIterator[StreamItem]:
    async with http.stream("POST", path, json=body, headers=STREAM_HEADERS) as response:
        if response.status_code >= 400:
            raise _refused(response, await response.aread())
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            yield lenient(Result, json.loads(await response.aread()))
            return
        async for sse in EventSource(response).aiter_sse():
            item = _item(sse.event, sse.data)
            if item is not None:
                yield item
                if isinstance(item, Result):
                    return
    raise StreamBroken("the stream ended before the call's result")
