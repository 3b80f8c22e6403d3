"""Faults answered truthfully: a full state directory or audit disk ends in truthful answers."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from sandboxd.audit import verify
from tests.faults.conftest import fill
from tests.support.audit import audit_records as records
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.wait import wait_until

SLOW = "import time\ntime.sleep(2)\nprint('ran')"
ENV = {"SANDBOXD_CONTAINER_ENABLED": "false"}


class Conn:
    """One keep-alive HTTP/1.1 connection; notices when the server dropped it."""

    def __init__(self, url: str) -> None:
        u = urlparse(url)
        self.http = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=60)
        self.http.connect()
        self.local = self.http.sock.getsockname()

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, dict, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"content-type": "application/json"} if data is not None else {}
        self.http.request(method, path, body=data, headers=headers)
        resp = self.http.getresponse()
        raw = resp.read()
        assert self.http.sock is not None and self.http.sock.getsockname() == self.local, \
            "the server closed the keep-alive connection"
        return resp.status, dict(resp.getheaders()), json.loads(raw) if raw else None

    def close(self) -> None:
        self.http.close()


def _decisions(d: RunningDaemon) -> int:
    return len(records(d.audit_path, "decision"))


def _during_call(d: RunningDaemon, conn: Conn, body: dict, fill_dir: Path
                 ) -> tuple[int, dict, Any, Path]:
    """Start a slow call on ``conn``, fill ``fill_dir`` once its decision is audited."""
    before = _decisions(d)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(conn.request, "POST", "/v1/tools/python/invoke", body)
        wait_until(lambda: _decisions(d) > before or call.done(), timeout=20,
                   what="the call's decision record")
        filler = fill(fill_dir)
        status, headers, answer = call.result(timeout=60)
    return status, headers, answer, filler


def test_state_dir_full(tmp_path: Path, tmpfs) -> None:  # type: ignore[no-untyped-def]
    state = tmpfs(tmp_path / "state", "16m")
    env = {**ENV, "SANDBOXD_AUDIT_LOG": str(tmp_path / "audit" / "audit.jsonl")}
    (tmp_path / "audit").mkdir()
    with running_daemon(tmp_path, state_dir=state, env=env) as d:
        conn = Conn(d.url)
        try:
            status, _, session = conn.request("POST", "/v1/sessions", {})
            assert status == 201, session
            # the disk fills while a session call runs: the call ran, so its result comes back
            # and is audited, although its session's expiry cannot be saved
            body = {"arguments": {"code": SLOW}, "session": session["id"]}
            status, _, result, filler = _during_call(d, conn, body, state)
            assert status == 200, result
            assert result["status"] == "ok" and result["stdout"] == "ran\n", result
            assert any(r["request_id"] == result["id"] for r in records(d.audit_path, "result"))
            # full: clear 507 problems before anything runs, on the same connection
            before = _decisions(d)
            status, headers, problem = conn.request("POST", "/v1/sessions", {})
            assert status == 507, problem
            assert headers["content-type"] == "application/problem+json"
            assert "state directory" in problem["detail"]
            for sid in (None, session["id"]):
                status, headers, problem = conn.request(
                    "POST", "/v1/tools/python/invoke",
                    {"arguments": {"code": "print(1)"}, "session": sid})
                assert status == 507, problem
                assert headers["content-type"] == "application/problem+json"
            assert _decisions(d) == before, "nothing may run (or be decided) on a full disk"
            status, _, ready = conn.request("GET", "/readyz")
            assert status == 503 and not ready["storage"]["state_dir"]["ok"], ready
            # space returns: everything works again by itself
            filler.unlink()
            status, _, ready = conn.request("GET", "/readyz")
            assert status == 200, ready
            status, _, again = conn.request("POST", "/v1/sessions", {})
            assert status == 201, again
        finally:
            conn.close()


def test_audit_disk_full_between_decision_and_result(tmp_path: Path, tmpfs
                                                     ) -> None:  # type: ignore[no-untyped-def]
    audit_dir = tmpfs(tmp_path / "audit", "4m")
    env = {**ENV, "SANDBOXD_AUDIT_LOG": str(audit_dir / "audit.jsonl")}
    with running_daemon(tmp_path, env=env) as d:
        conn = Conn(d.url)
        try:
            body = {"arguments": {"code": SLOW}}
            status, headers, problem, filler = _during_call(d, conn, body, audit_dir)
            # the call ran: never "refused"; the client gets its result
            assert status == 507, problem
            assert headers["content-type"] == "application/problem+json"
            assert problem["ran"] is True and "refused" not in problem["detail"], problem
            assert problem["result"]["status"] == "ok", problem
            assert problem["result"]["stdout"] == "ran\n"
            ran_id = problem["result"]["id"]
            # readiness says what is broken
            status, _, ready = conn.request("GET", "/readyz")
            assert status == 503 and not ready["storage"]["audit_log"]["ok"], ready
            # a new call is refused before it runs, and says so
            status, _, problem = conn.request("POST", "/v1/tools/python/invoke",
                                              {"arguments": {"code": "print(1)"}})
            assert status == 507 and problem["ran"] is False, problem
            # space returns: ready again by itself, the result written late, chain intact
            filler.unlink()
            wait_until(lambda: d.client.get("/readyz").status_code == 200, timeout=20,
                       what="/readyz 200")
            assert any(r["request_id"] == ran_id for r in records(d.audit_path, "result"))
            assert verify(d.audit_path).ok
        finally:
            conn.close()


def test_unrecorded_result_is_interrupted_at_next_start(tmp_path: Path, tmpfs
                                                       ) -> None:  # type: ignore[no-untyped-def]
    audit_dir = tmpfs(tmp_path / "audit", "4m")
    env = {**ENV, "SANDBOXD_AUDIT_LOG": str(audit_dir / "audit.jsonl")}
    state = tmp_path / "state"
    with running_daemon(tmp_path, env=env, state_dir=state) as d:
        conn = Conn(d.url)
        try:
            status, _, problem, filler = _during_call(d, conn, {"arguments": {"code": SLOW}},
                                                      audit_dir)
            assert status == 507 and problem["ran"] is True, problem
            ran_id = problem["result"]["id"]
        finally:
            conn.close()
        assert d.stop() == 0  # a clean stop, while the audit log is still full
    filler.unlink()
    with running_daemon(tmp_path, env=env, state_dir=state) as d:
        reported = [rid for r in records(d.audit_path, "interrupted")
                    for rid in r.get("requests", [])]
        assert ran_id in reported
        assert verify(d.audit_path).ok


def test_a_kernel_stays_awake_when_its_state_has_no_room_on_disk(
        tmp_path: Path, tmpfs) -> None:  # type: ignore[no-untyped-def]
    """Hibernation writes a state only while the state directory's filesystem keeps its
    margin free (the audit log and the sessions' files live there too): on a small disk the
    idle kernel stays in memory, with its variables, and the log says why."""
    state = tmpfs(tmp_path / "state", "64m")
    env = {**ENV, "SANDBOXD_KERNEL_HIBERNATE_AFTER_S": "0.2",
           "SANDBOXD_AUDIT_LOG": str(tmp_path / "audit" / "audit.jsonl")}
    (tmp_path / "audit").mkdir()
    with running_daemon(tmp_path, state_dir=state, env=env) as d:
        sid = d.client.post("/v1/sessions").json()["id"]
        assert d.python(sid, "x = 41\nx")["value"] == 41
        wait_until(lambda: "stays awake: the disk has too little room" in d.log(), timeout=60,
                   what="the sweep's word that the kernel stays awake")
        assert list((state / "hibernated").iterdir()) == []
        assert d.client.get("/v1/capacity").json()["kernels"]["hibernated"] == 0
        body = d.python(sid, "x + 1")
        assert body["value"] == 42 and body["kernel"]["calls"] == 2, body
