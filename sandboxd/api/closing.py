"""While the daemon drains, every response tells its client to close the connection.

A kept-alive connection that carried a call is idle once the response has gone out; at the end
of the drain the server closes its idle connections. A client (HAProxy in front of a fleet,
an agent's HTTP pool) that sends its next request on such a connection at that moment gets
neither an answer nor a refusal: "server disconnected without sending a response", a call
whose fate it cannot know. With ``Connection: close`` on every response written while the
daemon drains (the answers of in-flight calls, the 503s of new ones), no connection that
answered during the drain is reused: the client's next request opens a new one, which the
stopping daemon answers or refuses outright."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_CLOSE = (b"connection", b"close")


class CloseWhileDraining:
    """ASGI middleware: ``Connection: close`` on a response that starts while ``draining()``."""

    def __init__(self, app: ASGIApp, draining: Callable[[], bool]) -> None:
        self.app = app
        self.draining = draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def closing_send(message: Message) -> None:
            # decided when the response starts: a call admitted before the drain answers
            # during it
            if message["type"] == "http.response.start" and self.draining():
                message = {**message, "headers": [*message.get("headers", ()), _CLOSE]}
            await send(message)

        await self.app(scope, receive, closing_send)
