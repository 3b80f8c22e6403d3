"""A scripted Docker engine: a real HTTP/1.1 server on a unix socket (keep-alive, as the
engine) that answers as a test tells it, counts its connections, and can stop listening
while the connections it has stay served, as a stopping engine does."""

from __future__ import annotations

import contextlib
import os
import socketserver
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

Answer = tuple[int, str, bytes]  # status, content type, body


class ScriptedEngine(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The server; ``answer(method, path, body)`` gives each answer."""

    daemon_threads = True
    answer: Callable[[str, str, bytes], Answer]
    seen: list[tuple[str, str, bytes]]
    connections: int
    close_after_answer: bool


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the engine
    server: ScriptedEngine

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append((self.command, self.path, body))
        status, ctype, data = self.server.answer(self.command, self.path, body)
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if self.server.close_after_answer:
            self.close_connection = True

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def scripted_engine(path: Path) -> Iterator[ScriptedEngine]:
    """A scripted engine listening on ``path``; it answers ``{}`` until told otherwise."""
    srv = ScriptedEngine(str(path), Handler)
    srv.answer = lambda method, path, body: (200, "application/json", b"{}")
    srv.seen, srv.connections, srv.close_after_answer = [], 0, False
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def stop_listening(srv: ScriptedEngine) -> None:
    """Close the listener (new connections are refused) while the connections it accepted
    are still served: what a stopping engine does before it stops its containers."""
    srv.shutdown()
    srv.socket.close()
    os.unlink(srv.server_address)  # type: ignore[arg-type]
