"""During the drain a session's call is refused with 503 ``draining`` like any new call, but
never told to retry on another instance: its session lives on this node only, and is kept for
its next start (``sessions_survive_restart``), where the call then succeeds."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandboxd.errors import Draining
from tests.service.procs import ProcId, call_workers, still_alive
from tests.service.test_drain import BUSY, _call
from tests.support.daemon import daemon_list, start_daemon
from tests.support.mounts import detach_below
from tests.support.wait import wait_until

pytestmark = pytest.mark.same_on_every_host(
    "what a session's call is told during a drain is the daemon's own answer; the service job "
    "stops and restarts the shipped unit with sessions kept (restart-keeps-* checks)")

GRACE_S = 30  # the busy call holds the drain open this long, then it is cancelled
ENV = {"SANDBOXD_DRAIN_GRACE_S": str(GRACE_S), "SANDBOXD_CONTAINER_ENABLED": "false"}


def test_a_session_call_during_the_drain_is_told_to_come_back_here(tmp_path: Path) -> None:
    workers: list[ProcId] = []
    (tmp_path / "d0").mkdir()
    (tmp_path / "d1").mkdir()
    with daemon_list() as started:
        d = start_daemon(tmp_path / "d0", state_dir=tmp_path / "state",
                         env={**ENV, "SANDBOXD_SESSIONS_SURVIVE_RESTART": "true"})
        started.append(d)
        r = d.client.post("/v1/sessions")
        assert r.status_code == 201, r.text
        session = r.json()["id"]
        results: list[Any] = []
        busy = threading.Thread(target=_call, args=(d.url, BUSY, results, GRACE_S * 4),
                                daemon=True)
        busy.start()
        workers = wait_until(lambda: call_workers(d.proc.pid, d.state_dir, 1), timeout=120,
                             what="a busy worker holding the drain open")
        d.proc.send_signal(signal.SIGTERM)

        def refused(path: str, **body: Any) -> httpx.Response | None:
            r = d.client.post(path, json={"arguments": {"code": "1"}, **body})
            return r if r.status_code == 503 else None

        by_path = wait_until(lambda: refused(f"/v1/sessions/{session}/tools/python/invoke"),
                             timeout=GRACE_S / 2, what="a 503 for the session's call")
        by_body = refused("/v1/tools/python/invoke", session=session)
        one_shot = refused("/v1/tools/python/invoke")
        assert by_body is not None and one_shot is not None
        for r in (by_path, by_body):
            problem = r.json()
            assert r.headers["content-type"].startswith("application/problem+json")
            assert problem["type"].endswith("/draining"), problem
            assert "another instance" not in problem["detail"], problem
            assert "retry the call here once the daemon is back" in problem["detail"], problem
        assert "another instance" in one_shot.json()["detail"]  # it may run anywhere
        assert d.proc.wait(GRACE_S + 60) == 0, d.log()[-3000:]
        busy.join(30)
        assert not still_alive(workers)
        # what the 503 said is true: here, once the daemon is back, the call runs
        again = start_daemon(tmp_path / "d1", state_dir=tmp_path / "state", env=ENV)
        started.append(again)
        r = again.client.post(f"/v1/sessions/{session}/tools/python/invoke",
                              json={"arguments": {"code": "6 * 7"}})
        assert r.status_code == 200 and r.json()["value"] == 42, r.text
    assert detach_below(tmp_path / "state" / "workspaces") == []


def test_without_surviving_sessions_the_session_is_said_to_end() -> None:
    detail = str(Draining.for_call("ses_x", sessions_survive=False))
    assert "ends with it" in detail and "retry the call here" not in detail
    assert "another instance" in str(Draining.for_call(None, sessions_survive=True))
