"""Connection exhaustion through a real daemon: half-open connections (request headers never
finished) cannot exhaust it. With RLIMIT_NOFILE at 1024, 1,500 idle half-open sockets from one
peer: ``/healthz`` and an authenticated call are still served, the daemon stays well below its
descriptor limit, and the half-open sockets are closed after the header timeout, also the one
that trickles its headers a byte at a time."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import select
import socket
import time
from pathlib import Path

import httpx

from sandboxd.access.tokens import add_token
from sandboxd.api.connections import connection_caps
from tests.support.ci import require
from tests.support.daemon import running_daemon
from tests.support.wait import wait_until

HALF_OPEN = 1500
NOFILE = 1024
HEADER_TIMEOUT = 3.0


def _raise_own_nofile(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed <= hard or (hard == resource.RLIM_INFINITY and soft < needed):
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    require(soft >= needed, f"RLIMIT_NOFILE of at least {needed} for the test process")


def _open_half(port: int, n: int) -> list[socket.socket]:
    """``n`` connections that send the start of a request and never finish its headers."""
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(2.0)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        except OSError:  # the daemon already closed it (evicted) or the backlog is full
            s.close()
            continue
        socks.append(s)
    return socks


def _closed(s: socket.socket) -> bool:
    """The daemon closed it (EOF, reset, or a 503 it sent before closing), without waiting."""
    poller = select.poll()
    poller.register(s, select.POLLIN | select.POLLRDHUP | select.POLLERR | select.POLLHUP)
    if not poller.poll(0):
        return False
    s.setblocking(False)
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except BlockingIOError:  # data (a 503) but no EOF yet
        return False
    return True


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_half_open_connections_do_not_exhaust_the_daemon(tmp_path: Path) -> None:
    _raise_own_nofile(HALF_OPEN + 256)
    tokens = tmp_path / "tokens.yaml"
    good = add_token(tokens, "alice")
    env = {"SANDBOXD_TOKENS_FILE": str(tokens),
           "SANDBOXD_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT)}
    with running_daemon(tmp_path, env=env, token=good, nofile=NOFILE) as d:
        port = int(d.url.rsplit(":", 1)[1])
        socks = _open_half(port, HALF_OPEN)
        trickle = _open_half(port, 1)[0]
        try:
            assert len(socks) >= HALF_OPEN // 2, len(socks)
            peak = _fds(d.proc.pid)
            # still served, before any header timeout: a fresh connection evicts idle ones
            started = time.monotonic()
            assert httpx.get(f"{d.url}/healthz", timeout=10).status_code == 200
            r = httpx.post(f"{d.url}/v1/tools/python/invoke", timeout=60,
                           json={"arguments": {"code": "6 * 7"}},
                           headers={"Authorization": f"Bearer {good}"})
            assert r.status_code == 200 and r.json()["value"] == 42, r.text
            assert time.monotonic() - started < HEADER_TIMEOUT + 10
            total, _ = connection_caps(None, None, NOFILE)
            assert _fds(d.proc.pid) < NOFILE - 128 and peak < NOFILE - 128, (peak, total)
            # the half-open ones are all closed after the header timeout, the trickling one
            # too although it keeps sending
            def all_closed() -> bool:
                open_ = [s for s in socks if not _closed(s)]
                if _closed(trickle):
                    return not open_
                with contextlib.suppress(OSError):
                    trickle.send(b"X")
                return False

            wait_until(all_closed, timeout=HEADER_TIMEOUT + 15, interval=0.5,
                       what="every half-open connection closed, the trickling one too")
            metrics = httpx.get(f"{d.url}/metrics", timeout=10,
                                headers={"Authorization": f"Bearer {good}"}).text
            timed_out = re.search(
                r'sandboxd_connections_closed_total\{reason="header_timeout"\} ([0-9.]+)',
                metrics)
            assert timed_out and float(timed_out.group(1)) >= 1, metrics[-2000:]
            assert httpx.get(f"{d.url}/healthz", timeout=10).status_code == 200
        finally:
            for s in [*socks, trickle]:
                s.close()


def test_a_kept_alive_client_is_served_across_requests(tmp_path: Path) -> None:
    env = {"SANDBOXD_HEADER_TIMEOUT_S": "2"}
    with running_daemon(tmp_path, env=env) as d, \
            httpx.Client(base_url=d.url, timeout=30) as c:
        for _ in range(3):
            assert c.get("/healthz").status_code == 200
        # a call that runs longer than the header timeout is not cut off
        code = ("import datetime\ns = datetime.datetime.now().timestamp()\n"
                "while datetime.datetime.now().timestamp() - s < 3:\n    pass\n7")
        r = c.post("/v1/tools/python/invoke", json={"arguments": {"code": code}})
        assert r.status_code == 200 and r.json()["value"] == 7, r.text


def test_caps_follow_the_descriptor_limit() -> None:
    assert connection_caps(None, None, 1024) == (512, 128)
    assert connection_caps(100_000, None, 1024) == (768, 192)  # never near the limit
    assert connection_caps(50, 10, 1024) == (50, 10)
    assert connection_caps(None, None, 65536)[0] == 32768
