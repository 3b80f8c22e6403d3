"""sd_notify over a real AF_UNIX datagram socket, as systemd's manager receives it."""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.health import notify


@pytest.fixture
def receiver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A bound datagram socket standing in for systemd; ``$NOTIFY_SOCKET`` points at it."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield sock
    sock.close()


def _fields(sock: socket.socket) -> dict[str, str]:
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.split("\n"))


def test_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"sandboxd-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify.notify("READY=1")
        assert _fields(sock)["READY"] == "1"


def test_no_socket_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify.notify("READY=1") is False
    assert notify.notify("STOPPING=1") is False


def test_dead_socket_is_swallowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens.sock"))
    assert notify.notify("READY=1") is False  # logged, not raised
    monkeypatch.setenv("NOTIFY_SOCKET", "relative/path")
    assert notify.notify("READY=1") is False


def test_unset_environment(receiver: socket.socket) -> None:
    assert notify.notify("READY=1", unset_environment=True)
    assert "NOTIFY_SOCKET" not in os.environ
    assert notify.notify("READY=1") is False


def test_invalid_field_is_refused(receiver: socket.socket) -> None:
    with pytest.raises(ValueError):
        notify.notify("READY")
    with pytest.raises(ValueError):
        notify.notify("STATUS=a\nREADY")


def test_multi_line_message(receiver: socket.socket) -> None:
    """One argument may carry several fields, as the daemon's lifespan sends them."""
    assert notify.notify("READY=1\nSTATUS=serving")
    assert _fields(receiver) == {"READY": "1", "STATUS": "serving"}


def test_daemon_notifies_ready_then_stopping(tmp_path: Path) -> None:
    """A real `sandboxd serve` tells its (fake) service manager READY=1, then STOPPING=1."""
    from tests.support.daemon import start_daemon

    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(60)
        daemon = start_daemon(tmp_path, env={"NOTIFY_SOCKET": str(path)})
        try:
            first = _fields(sock)
            assert first.get("READY") == "1", first
            assert daemon.client.get("/healthz").status_code == 200
        finally:
            daemon.client.close()
            code = daemon.stop()
        seen: list[dict[str, str]] = []
        sock.settimeout(5)
        with contextlib.suppress(TimeoutError):
            while True:
                seen.append(_fields(sock))
        assert any(f.get("STOPPING") == "1" for f in seen), seen
        assert code == 0, daemon.log()


@pytest.mark.same_on_every_host(
    "how the test suite's start_daemon waits is test plumbing; the daemon's READY=1 and "
    "STOPPING=1 are proven in the VM by test_daemon_notifies_ready_then_stopping and under "
    "real systemd by the service job's type-notify-ready check")
def test_test_daemons_start_on_ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``start_daemon`` waits for the daemon's READY=1 on a socket of its own (not a /healthz
    poll every 50 ms, whose CPU the VM job's emulation took from the daemon starting), and
    keeps the socket for the daemon's STOPPING=1."""
    from tests.support import daemon as support

    said: list[bool] = []
    real = support._said_ready

    def spy(sock: socket.socket, wait_s: float = 0.5) -> bool:
        said.append(real(sock, wait_s))
        return said[-1]

    monkeypatch.setattr(support, "_said_ready", spy)
    d = support.start_daemon(tmp_path)
    try:
        assert said, "start_daemon never listened on its notify socket"
        # READY=1 came while start_daemon waited, or (a loaded host: /healthz answered first,
        # the daemon sends it right after listening) it is waiting on the socket now
        assert said[-1] is True or support._said_ready(d.notify, 30.0), (said, d.log())
        assert d.notify is not None
    finally:
        d.client.close()
        assert d.stop() == 0
    assert d.notify.fileno() == -1  # closed with the daemon
    assert "sd_notify" not in d.log(), d.log()  # its STOPPING=1 reached the socket
