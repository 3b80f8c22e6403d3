"""A slow client must not starve others, through a real daemon with tokens: raw file transfers never
hold execution slots. Four uploads trickling a byte a second (alice) once held all four slots, and
another client's ``print(1)`` waited for the upload deadline; now it runs at once, the trickling
uploads end with 408 under ``transfer_min_rate_bytes_s`` and leave nothing, and a fast upload
of another client goes through (and counts against its session's quota) meanwhile."""

from __future__ import annotations

import re
import select
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest

from sandboxd.access.tokens import add_token
from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.wait import wait_until

#: the uploads may go under the minimum rate this long: longer than the other client's call
#: takes (bounded below by BOUND_S), so they still run while it does
GRACE_S = 8.0
#: the other client's call with four trickling uploads must finish within this; the old
#: daemon made it wait for a slot until its queue timeout (30 s) or deadline
BOUND_S = 5.0
QUOTA = 1536 * 1024  # room for one upload of the default policy's max_bytes (1 MiB), not two
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningDaemon, str]]:
    """A daemon with the default policy (write_file: 60 s, 1 MiB), 4 execution slots; its
    client is alice (the trickler), the token returned is bob's."""
    tmp = tmp_path_factory.mktemp("transfer-slots")
    tokens = tmp / "tokens.yaml"
    keys = {name: add_token(tokens, name) for name in ("alice", "bob")}
    settings = {"SANDBOXD_TOKENS_FILE": str(tokens), "SANDBOXD_RATE_LIMIT_PER_MINUTE": "0",
                "SANDBOXD_MAX_CONCURRENCY": "4", "SANDBOXD_CONTAINER_ENABLED": "false",
                "SANDBOXD_SESSION_QUOTA_BYTES": str(QUOTA),
                "SANDBOXD_TRANSFER_RATE_GRACE_S": str(GRACE_S)}
    with running_daemon(tmp, env=settings, token=keys["alice"]) as d:
        yield d, keys["bob"]


def _gauge(d: RunningDaemon, name: str) -> float:
    match = re.search(rf"^{name} ([0-9.]+)$", d.client.get("/metrics").text, re.MULTILINE)
    assert match, name
    return float(match.group(1))


def _trickle(d: RunningDaemon, session: str, name: str, stop: threading.Event) -> bytes:
    """A raw ``PUT`` that declares 1 MiB and sends one byte a second until the daemon answers
    (or ``stop``); returns the response's head and body."""
    host, port = d.url.removeprefix("http://").split(":")
    head = (f"PUT /v1/sessions/{session}/files/{name} HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: {d.headers['Authorization']}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {MIB}\r\n\r\n")
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(head.encode())
        reply = b""
        while not stop.is_set():
            # the client under test: the next byte a second later, unless the answer came
            readable, _, _ = select.select([conn], [], [], 1.0)
            if readable:
                chunk = conn.recv(65536)
                reply += chunk
                if not chunk or _complete(reply):
                    return reply
            else:
                conn.sendall(b"\7")
        return reply


def _complete(reply: bytes) -> bool:
    if b"\r\n\r\n" not in reply:
        return False
    head, body = reply.split(b"\r\n\r\n", 1)
    length = re.search(rb"content-length: *(\d+)", head.lower())
    return length is not None and len(body) >= int(length.group(1))


@contextmanager
def trickling(d: RunningDaemon, count: int) -> Iterator[tuple[str, list[Future[bytes]]]]:
    """``count`` trickling uploads of alice into a session of hers, all of them received by
    the daemon (their ``decision`` audited); yields the session and the uploads' replies."""
    session = d.client.post("/v1/sessions").json()["id"]
    stop = threading.Event()
    before = len(audit_records(d.audit_path))
    with ThreadPoolExecutor(count) as pool:
        try:
            uploads = [pool.submit(_trickle, d, session, f"slow{i}.bin", stop)
                       for i in range(count)]
            wait_until(lambda: len([r for r in audit_records(d.audit_path)[before:]
                                    if r.get("event") == "decision"
                                    and r.get("tool") == "write_file"]) == count,
                       timeout=30, interval=0.05, what=f"{count} uploads decided on")
            yield session, uploads
        finally:
            stop.set()
    d.client.delete(f"/v1/sessions/{session}")


def _print(d: RunningDaemon, bob: str) -> float:
    """Seconds bob's ``print(1)`` takes, end to end."""
    began = time.monotonic()
    r = httpx.post(f"{d.url}/v1/tools/python/invoke", json={"arguments": {"code": "print(1)"}},
                   headers={"Authorization": f"Bearer {bob}"}, timeout=120)
    took = time.monotonic() - began
    assert r.status_code == 200 and r.json()["stdout"] == "1\n", r.text
    return took


def test_trickling_uploads_hold_no_slot_and_end_with_408(
        env: tuple[RunningDaemon, str]) -> None:
    d, bob = env
    alone = statistics.median(_print(d, bob) for _ in range(3))
    with trickling(d, 4) as (session, uploads):
        took = _print(d, bob)
        print(f"\nbob's print(1): {took * 1000:.0f} ms with 4 trickling uploads, "
              f"{alone * 1000:.0f} ms without")
        assert took < BOUND_S, f"{took:.1f} s (without uploads {alone:.3f} s)"
        assert not any(u.done() for u in uploads), "an upload ended before the call did"
        assert _gauge(d, "sandboxd_slots_in_use") == 0
        assert _gauge(d, "sandboxd_transfers_in_use") == 4
        replies = [u.result(timeout=GRACE_S + 60) for u in uploads]
        for reply in replies:
            assert reply.startswith(b"HTTP/1.1 408"), reply[:300]
            assert b"/upload-timeout" in reply and b"minimum of 65536 bytes/s" in reply, reply
        # no file, no temporary file
        assert list((d.state_dir / "workspaces" / session).rglob("*")) == []
    results = [r for r in audit_records(d.audit_path)
               if r.get("event") == "result" and r.get("session") == session]
    assert [r["status"] for r in results] == ["error"] * 4, results
    assert all("minimum of" in r["message"] for r in results), results


def test_a_fast_upload_goes_through_and_counts_against_the_quota(
        env: tuple[RunningDaemon, str]) -> None:
    d, bob = env
    data = bytes(range(256)) * (MIB // 256)
    with httpx.Client(base_url=d.url, headers={"Authorization": f"Bearer {bob}"},
                      timeout=120) as c, trickling(d, 4):
        sid = c.post("/v1/sessions").json()["id"]
        began = time.monotonic()
        put = c.put(f"/v1/sessions/{sid}/files/fast.bin", content=data)
        took = time.monotonic() - began
        assert put.status_code == 200, put.text
        assert took < BOUND_S, f"{took:.1f} s"
        assert put.json()["value"] == {"path": "fast.bin", "bytes": MIB}
        assert c.get(f"/v1/sessions/{sid}/files/fast.bin").content == data
        # what it took of the quota is gone: another MiB does not fit (declared or not)
        for body in (data, iter([data[:1000], data[1000:]])):
            over = c.put(f"/v1/sessions/{sid}/files/more.bin", content=body)
            assert over.status_code == 409, over.text
            assert over.json()["type"].endswith("/session-over-quota")
        ws = d.state_dir / "workspaces" / sid
        assert sorted(p.name for p in ws.iterdir()) == ["fast.bin"]
        c.delete(f"/v1/sessions/{sid}")


def test_a_reader_that_does_not_read_holds_no_slot(env: tuple[RunningDaemon, str]) -> None:
    """A download is read within its call and sent after it: four readers that never read
    hold no execution slot and no transfer slot."""
    d, bob = env
    sid = d.client.post("/v1/sessions").json()["id"]
    assert d.client.put(f"/v1/sessions/{sid}/files/big.bin",
                        content=b"\1" * MIB).status_code == 200
    host, port = d.url.removeprefix("http://").split(":")
    request = (f"GET /v1/sessions/{sid}/files/big.bin HTTP/1.1\r\nHost: {host}\r\n"
               f"Authorization: {d.headers['Authorization']}\r\n\r\n").encode()
    readers = [socket.create_connection((host, int(port))) for _ in range(4)]
    try:
        for conn in readers:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            conn.sendall(request)
        wait_until(lambda: len([r for r in audit_records(d.audit_path)
                                if r.get("event") == "result" and r.get("session") == sid
                                and r.get("tool") == "read_file"]) == 4,
                   timeout=30, interval=0.05, what="4 downloads read")
        assert _print(d, bob) < BOUND_S
        assert _gauge(d, "sandboxd_slots_in_use") == 0
        assert _gauge(d, "sandboxd_transfers_in_use") == 0
    finally:
        for conn in readers:
            conn.close()
        d.client.delete(f"/v1/sessions/{sid}")
