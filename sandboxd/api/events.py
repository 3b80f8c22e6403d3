"""Streamed invoke (output while a long call runs): ``POST /v1/tools/{name}/invoke`` with ``Accept:
text/event-stream`` answers with Server-Sent Events while the call runs.

Events (one JSON object per ``data:`` line, :mod:`sandboxd.results.streaming`): ``stdout`` and
``stderr`` (``{"text": ...}``, as produced, within the call's output cap), ``display`` (a
display item), then exactly one ``result`` (the same object a plain call returns) - or, when
the service fails after the call started, one ``error`` carrying the problem+json object.
``: ping`` comments keep a silent connection open.

Anything that refuses the call before it runs (unknown tool, bad arguments, authentication,
the queue full, draining) answers exactly as without streaming: problem+json with its
status. A policy denial is a stream with its one ``result`` event (as the plain route gives
200 with ``status: denied``). A client that disconnects cancels the call, as on the plain
route.

Buffering: the sink puts events on an unbounded queue, which still holds at most what one
call may produce - its output cap and its display caps - so a slow reader costs at most that
much memory; the sandbox is never slowed down by a reader.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from sandboxd.api.problems import problem_body
from sandboxd.models import InvokeRequest, Result
from sandboxd.results.streaming import StreamEvent
from sandboxd.service import Sandboxd
from sandboxd.util.deadline import stop_task

MEDIA_TYPE = "text/event-stream"
PING_S = 15.0
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def wants_stream(request: Request) -> bool:
    """The caller asked for Server-Sent Events."""
    return MEDIA_TYPE in request.headers.get("accept", "").lower()


def frame(kind: str, payload: Any) -> bytes:
    """One SSE event (``ensure_ascii``: the data line holds no raw newline or control)."""
    return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return




async def stream_invoke(service: Sandboxd, client: str, name: str, body: InvokeRequest,
                        request: Request) -> Response:
    """Start the call; answer problem+json if it is refused before it runs, else stream."""
    queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
    started = asyncio.Event()
    call = asyncio.create_task(service.invoke(client, name, body, events=queue.put_nowait,
                                              started=started))
    begun = asyncio.create_task(started.wait())
    gone = asyncio.create_task(disconnected(request))
    try:
        done, _ = await asyncio.wait({call, begun, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        begun.cancel()
    if call not in done and gone in done:
        await stop_task(call)
        return Response(status_code=499)  # nobody is listening any more
    if call.done() and call.exception() is not None:
        gone.cancel()
        raise call.exception()  # type: ignore[misc]  # refused: problem+json, as plain
    return StreamingResponse(_events(call, queue, gone), media_type=MEDIA_TYPE,
                             headers=HEADERS)


async def _events(call: asyncio.Task[Result], queue: asyncio.Queue[StreamEvent],
                  gone: asyncio.Task[None]) -> AsyncIterator[bytes]:
    """The stream: output events as they come, pings, then the one result (or error)."""
    try:
        while not call.done():
            get = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({get, call, gone}, timeout=PING_S,
                                         return_when=asyncio.FIRST_COMPLETED)
            if get in done:
                event = get.result()
                yield frame(event.kind, event.payload())
                continue
            get.cancel()
            if gone in done:
                return  # the finally below cancels the call
            if not done:
                yield b": ping\n\n"
        for chunk in _ending(call, queue):
            yield chunk
    finally:
        gone.cancel()
        if not call.done():
            call.cancel()  # the service cleans up and audits in the call's own task


def _ending(call: asyncio.Task[Result], queue: asyncio.Queue[StreamEvent]) -> Iterator[bytes]:
    """The end of the stream of a call that is done: the events still queued, then its one
    result (or error)."""
    while not queue.empty():
        event = queue.get_nowait()
        yield frame(event.kind, event.payload())
    exc = call.exception()
    if exc is not None:
        yield frame("error", problem_body(exc))
    else:
        yield frame("result", call.result().wire())
