"""Run any small ASGI app on a free loopback port in a thread (for protocol corner cases)."""

from __future__ import annotations

import threading
from typing import Any

import uvicorn

from tests.support.daemon import free_port
from tests.support.wait import wait_until


class StubServer:
    """``with StubServer(app) as s: httpx.get(s.url)``."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                     log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> StubServer:
        self._thread.start()
        def started() -> bool:
            if not self._thread.is_alive():
                raise RuntimeError("stub server did not start")
            return self._server.started

        try:
            wait_until(started, timeout=20, interval=0.01, what="the stub server to start")
        except AssertionError:
            raise RuntimeError("stub server did not start") from None
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)
