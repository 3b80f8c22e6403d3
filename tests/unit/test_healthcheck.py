"""The image's HEALTHCHECK (sandboxd/health/check.py) against real HTTP servers: on the unix
socket when it exists, else on the TCP port; 200 is healthy, anything else or no answer is not."""

from __future__ import annotations

import http.server
import json
import socket
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.health import check as healthcheck

#: what the test servers answer /readyz with (the shape of an unready daemon's answer)
BODY = json.dumps({"ready": False, "draining": False,
                   "backends": {"restricted": {"ok": False, "detail": "probe timed out"}}},
                  indent=2).encode()


def _handler(status: int, seen: list[str]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(status)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[object]:
    servers: list[socketserver.BaseServer] = []

    def start(status: int, *, unix: bool) -> tuple[str | int, list[str]]:
        seen: list[str] = []
        handler = _handler(status, seen)
        server: socketserver.BaseServer
        if unix:
            path = str(tmp_path / f"d{len(servers)}.sock")

            class Unix(handler):  # type: ignore[misc, valid-type]
                def address_string(self) -> str:
                    return "unix"

            server = _UnixServer(path, Unix)
            where: str | int = path
        else:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
            where = server.server_address[1]
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return where, seen

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status, healthy", [(200, True), (503, False), (500, False)])
def test_the_socket_answer_decides(serve, status: int, healthy: bool) -> None:  # type: ignore[no-untyped-def]
    path, seen = serve(status, unix=True)
    assert healthcheck.ready(str(path)) is healthy
    assert seen == ["/readyz"]


def test_without_the_socket_it_asks_the_tcp_port(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    port, seen = serve(200, unix=False)
    assert healthcheck.ready(str(tmp_path / "absent.sock"), port=int(port)) is True
    assert seen == ["/readyz"]


def test_the_port_comes_from_sandboxd_port(serve, tmp_path: Path,  # type: ignore[no-untyped-def]
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    port, seen = serve(503, unix=False)
    monkeypatch.setenv("SANDBOXD_PORT", str(port))
    assert healthcheck.ready(str(tmp_path / "absent.sock")) is False
    assert seen == ["/readyz"]


def test_nothing_listening_is_unhealthy(tmp_path: Path) -> None:
    dead = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX) as s:  # a socket file nobody listens on any more
        s.bind(str(dead))
    assert healthcheck.ready(str(dead)) is False
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert healthcheck.ready(str(tmp_path / "absent.sock"), port=free) is False


def test_a_silent_daemon_is_unhealthy_within_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "silent.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(1)  # accepts (the backlog) but never answers
        assert healthcheck.ready(str(path), timeout=0.5) is False


def test_the_image_command_exits_by_the_answer(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`python -I -m sandboxd.health.check`, as the Dockerfile runs it, with the socket path
    pointed at the test's server: unhealthy, it prints why on one line (the engine keeps the
    output in the container's health log); healthy, nothing."""
    code = ("import sys, sandboxd.health.check as h; h.SOCKET = sys.argv[1]; h.main()")
    for status, rc in ((200, 0), (503, 1)):
        path, _ = serve(status, unix=True)
        run = subprocess.run([sys.executable, "-I", "-c", code, str(path)], timeout=60,
                             capture_output=True, text=True)
        assert run.returncode == rc, (status, run)
        if status == 200:
            assert run.stdout == "", run.stdout
        else:
            assert run.stdout.count("\n") == 1, run.stdout
            assert run.stdout.startswith("/readyz answered 503: {"), run.stdout
            assert '"detail": "probe timed out"' in run.stdout, run.stdout


def test_why_names_the_error_when_nothing_answers(tmp_path: Path) -> None:
    dead = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(dead))
    healthy, why = healthcheck.verdict(str(dead))
    assert not healthy and why.startswith("/readyz: ConnectionRefusedError"), why


def test_why_is_bounded(tmp_path: Path) -> None:
    """A daemon's answer is printed up to WHY_BYTES, however long it is."""
    path = tmp_path / "long.sock"
    body = b"x" * (healthcheck.WHY_BYTES * 4)

    def answer(listener: socket.socket) -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)

    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen(1)
        server = threading.Thread(target=answer, args=(listener,))
        server.start()
        healthy, why = healthcheck.verdict(str(path), timeout=30)
        server.join(timeout=30)
    assert not healthy
    assert why == "/readyz answered 503: " + "x" * healthcheck.WHY_BYTES


def test_it_imports_nothing_but_the_standard_library() -> None:
    code = ("import json, sys; before = set(sys.modules); import sandboxd.health.check; "
            "print(json.dumps(sorted(set(sys.modules) - before)))")
    run = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    loaded = json.loads(run.stdout)
    # the client package's own module gives DEFAULT_URL (its names, httpx's users, load on
    # first use: none of them is loaded)
    outside = [m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names
               and m.split(".")[0] != "sandboxd" and m != "sandboxd_client"]
    assert outside == [], outside
