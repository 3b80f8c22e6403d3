"""A client that does not read its answer, or does not send its request body, cannot hold the
daemon: while it serves, such a connection is closed after ``response_write_timeout_s`` /
``request_body_timeout_s``; at a stop, the daemon exits within ``drain_grace_s`` plus
``shutdown_timeout_s`` whatever its clients do."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.policy.store import embedded_policies_dir
from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, start_daemon
from tests.support.wait import wait_until

pytestmark = pytest.mark.same_on_every_host(
    "the connection deadlines and the stop's bound are the daemon's own timers; the VM's "
    "service job stops the shipped unit with an unread answer (stop-with-unread-answer-bounded)")

#: a call whose answer cannot fit in the kernel's socket buffers of a client that reads none
#: of it: over loopback TCP the daemon's send buffer grows to 4 MB (tcp_wmem), so 6 MB of
#: output (:func:`_loud_policy`); over the unit's unix socket 1 MB is enough
#: (tests/vm/guest/service-checks.sh)
LOUD = "print('x' * 6_000_000)"


def _loud_policy(tmp_path: Path) -> Path:
    """The shipped policy with its most output (8 MiB) as the default (a request can only
    lower a limit)."""
    text = (embedded_policies_dir() / "default.yaml").read_text()
    assert text.count("\n  output: 1Mi\n") == 1, "the shipped policy's output limit moved"
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "default.yaml").write_text(
        text.replace("\n  output: 1Mi\n", "\n  output: 8Mi\n"))
    return policies


@contextlib.contextmanager
def _deaf(d: RunningDaemon, code: str) -> Iterator[socket.socket]:
    """A connection that asks for a call printing ``code``'s output and never reads the answer
    (a small receive buffer: the daemon's send buffer fills at once)."""
    host, port = d.url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    body = json.dumps({"arguments": {"code": code}}).encode()
    sock.sendall(b"POST /v1/tools/python/invoke HTTP/1.1\r\nhost: localhost\r\n"
                 b"content-type: application/json\r\n"
                 + f"content-length: {len(body)}\r\n\r\n".encode() + body)
    try:
        yield sock
    finally:
        sock.close()


@contextlib.contextmanager
def _mute(d: RunningDaemon) -> Iterator[socket.socket]:
    """A connection whose request body stops after its first bytes."""
    host, port = d.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/tools/python/invoke HTTP/1.1\r\nhost: localhost\r\n"
                 b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n"
                 b'{"arguments": ')
    try:
        yield sock
    finally:
        sock.close()


def _closed(d: RunningDaemon, reason: str) -> float:
    text = d.client.get("/metrics").text
    line = f'sandboxd_connections_closed_total{{reason="{reason}"}} '
    return sum(float(x.removeprefix(line)) for x in text.splitlines() if x.startswith(line))


def _answered(d: RunningDaemon) -> bool:
    """The loud call ran (its result is audited): its answer is going out."""
    return bool(audit_records(d.audit_path, "result"))


def test_a_connection_that_does_not_read_or_send_is_closed(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, policies_dir=_loud_policy(tmp_path),
                     env={"SANDBOXD_CONTAINER_ENABLED": "false",
                          "SANDBOXD_RESPONSE_WRITE_TIMEOUT_S": "2",
                          "SANDBOXD_REQUEST_BODY_TIMEOUT_S": "2"})
    try:
        with _deaf(d, LOUD) as deaf, _mute(d) as mute:
            wait_until(lambda: _closed(d, "write_timeout") == 1, timeout=60,
                       what="the unread answer's connection closed")
            wait_until(lambda: _closed(d, "body_timeout") == 1, timeout=60,
                       what="the stopped body's connection closed")
            # both closed by the daemon: the peer sees the end (a reset, or EOF after the
            # bytes that had gone out)
            deaf.settimeout(30)
            with contextlib.suppress(ConnectionResetError):
                while deaf.recv(1 << 20):
                    pass
            mute.settimeout(30)
            with contextlib.suppress(ConnectionResetError):
                assert mute.recv(1024) == b""
        # and the daemon serves on
        assert d.invoke("python", {"code": "1 + 1"}).json()["value"] == 2
        assert d.stop() == 0
    finally:
        d.client.close()
        d.stop()


def test_a_stop_ends_within_its_bound_whatever_its_clients_do(tmp_path: Path) -> None:
    grace, bound = 1.0, 4.0
    d = start_daemon(tmp_path, policies_dir=_loud_policy(tmp_path),
                     env={"SANDBOXD_CONTAINER_ENABLED": "false",
                          "SANDBOXD_DRAIN_GRACE_S": str(grace),
                          "SANDBOXD_SHUTDOWN_TIMEOUT_S": str(bound),
                          # not these: the stop's own bound must end them
                          "SANDBOXD_RESPONSE_WRITE_TIMEOUT_S": "300",
                          "SANDBOXD_REQUEST_BODY_TIMEOUT_S": "300"})
    try:
        with _deaf(d, LOUD), _mute(d):
            wait_until(lambda: _answered(d), timeout=60, what="the loud call's result")
            started = time.monotonic()
            d.proc.send_signal(signal.SIGTERM)
            code = d.proc.wait(120)
            took = time.monotonic() - started
        assert code == 0, d.log()[-3000:]
        # the bound, and a margin for the process's own exit on a loaded host
        assert took < grace + bound + 10, f"the stop took {took:.1f} s"
        events = [r.get("event") for r in audit_records(d.audit_path)]
        assert events[-1] == "shutdown", events[-5:]
    finally:
        d.client.close()
        d.stop()
