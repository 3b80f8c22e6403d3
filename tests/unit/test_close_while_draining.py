"""sandboxd/api/closing.py: ``Connection: close`` on the responses that start while the daemon
drains, whenever their request arrived; nothing added otherwise."""

from __future__ import annotations

import asyncio

from starlette.types import Message, Receive, Scope, Send

from sandboxd.api.closing import CloseWhileDraining


def _respond(draining: list[bool], flip_before_response: bool) -> list[Message]:
    sent: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if flip_before_response:
            draining[0] = True  # the drain begins while the call runs
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(message: Message) -> None:
        sent.append(message)

    middleware = CloseWhileDraining(app, draining=lambda: draining[0])
    asyncio.run(middleware({"type": "http", "method": "POST", "path": "/"}, receive, send))
    return sent


def test_no_header_while_serving() -> None:
    start, body = _respond([False], flip_before_response=False)
    assert start["headers"] == [(b"content-type", b"text/plain")]
    assert body == {"type": "http.response.body", "body": b"ok"}


def test_close_on_a_response_that_starts_while_draining() -> None:
    for flip in (False, True):  # draining from the request on, or only from its response on
        start, _body = _respond([not flip], flip_before_response=flip)
        assert start["headers"] == [(b"content-type", b"text/plain"), (b"connection", b"close")]
