"""Interrupt before kill (so a runaway call need not cost its state), on the restricted backend
through a real daemon.

At a session call's wall-clock limit, on a client's disconnect and on ``POST
/v1/sessions/{id}/interrupt``, the call's code first gets a ``KeyboardInterrupt``; a kernel
back in its loop within ``kernel_interrupt_grace_s`` keeps its variables. Code that ignores
the interrupt (catches it, or sits in C code) is killed after the grace: the kernel is lost
and the slot freed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.restricted.test_kernel import kernel_process
from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.processes import running
from tests.support.wait import wait_until


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("interrupt"),
                        env={"SANDBOXD_KERNEL_INTERRUPT_GRACE_S": "2"}) as d:
        yield d


def session(daemon: RunningDaemon) -> str:
    resp = daemon.client.post("/v1/sessions", json={})
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def call(daemon: RunningDaemon, code: str, sid: str | None, timeout_s: float = 10) -> dict:
    body: dict = {"arguments": {"code": code}, "limits": {"timeout_s": timeout_s}}
    if sid is not None:
        body["session"] = sid
    resp = daemon.client.post("/v1/tools/python/invoke", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def test_a_timeout_interrupts_and_the_variables_are_kept(daemon: RunningDaemon) -> None:
    sid = session(daemon)
    assert call(daemon, "x = 41", sid)["status"] == "ok"
    res = call(daemon, "while True:\n    pass", sid, timeout_s=2)
    assert res["status"] == "timeout", res
    assert res["termination"]["reason"] == "wall_timeout", res
    assert res["kernel"]["lost"] is False and res["kernel"]["interrupted"] is True, res
    assert "KeyboardInterrupt" in res["stderr"], res
    assert "variables" in res["message"] and "kept" in res["message"], res
    after = call(daemon, "print(x + 1)", sid)
    assert after["status"] == "ok" and after["stdout"] == "42\n", after
    assert after["kernel"]["fresh"] is False and after["kernel"]["calls"] == 3, after


def test_a_sleep_is_interrupted_too(daemon: RunningDaemon) -> None:
    sid = session(daemon)
    assert call(daemon, "import time\ny = 'kept'", sid)["status"] == "ok"
    res = call(daemon, "time.sleep(60)", sid, timeout_s=1)
    assert res["status"] == "timeout" and res["kernel"]["interrupted"] is True, res
    assert call(daemon, "y", sid)["value"] == "kept"


@pytest.mark.parametrize("code", [
    "while True:\n    try:\n        while True:\n            pass\n"
    "    except KeyboardInterrupt:\n        pass",
    "sum(range(10 ** 13))",  # C code: no bytecode boundary for the interrupt to land on
])
def test_code_that_ignores_the_interrupt_is_killed_after_the_grace(
        daemon: RunningDaemon, code: str) -> None:
    sid = session(daemon)
    assert call(daemon, "x = 1", sid)["status"] == "ok"
    kernel = kernel_process(daemon.state_dir / "workspaces" / sid)
    res = call(daemon, code, sid, timeout_s=1)
    assert res["status"] == "timeout", res
    assert res["kernel"]["lost"] is True and res["kernel"]["interrupted"] is False, res
    assert res["cleanup"]["verified"] is True, res
    assert not running(kernel)
    # the slot is free and the session goes on with a fresh kernel
    fresh = call(daemon, "x = 2\nx", sid)
    assert fresh["value"] == 2 and fresh["kernel"]["fresh"] is True, fresh


def test_an_interrupt_request_ends_the_running_call_and_keeps_the_kernel(
        daemon: RunningDaemon) -> None:
    sid = session(daemon)
    assert call(daemon, "z = [1, 2]", sid)["status"] == "ok"
    results: list[dict] = []
    runner = threading.Thread(target=lambda: results.append(
        call(daemon, "print('started', flush=True)\nwhile True:\n    pass", sid,
             timeout_s=60)))
    runner.start()
    kernel = kernel_process(daemon.state_dir / "workspaces" / sid)
    # the call runs once its kernel burns CPU (the request reached it)
    wait_until(lambda: kernel.cpu_times().user > 0.2, timeout=60, what="the call to run")
    resp = daemon.client.post(f"/v1/sessions/{sid}/interrupt")
    assert resp.status_code == 200, resp.text
    assert resp.json()["interrupted"] == ["restricted"], resp.json()
    runner.join(timeout=60)
    assert results, "the interrupted call never answered"
    res = results[0]
    assert res["status"] == "killed" and res["termination"]["reason"] == "cancelled", res
    assert res["kernel"] == {"fresh": False, "calls": 2, "lost": False, "reason": None,
                             "interrupted": True}, res
    assert res["stdout"].startswith("started"), res
    assert call(daemon, "z", sid)["value"] == [1, 2]
    assert running(kernel)
    # nothing runs: a second interrupt finds no call
    again = daemon.client.post(f"/v1/sessions/{sid}/interrupt").json()
    assert again["interrupted"] == []
    events = audit_records(daemon.audit_path, "kernel_interrupt")
    assert [e["backends"] for e in events if e["session"] == sid] == [["restricted"], []]


def test_a_client_that_disconnects_keeps_the_kernel(daemon: RunningDaemon) -> None:
    sid = session(daemon)
    assert call(daemon, "w = 'still here'", sid)["status"] == "ok"
    kernel = kernel_process(daemon.state_dir / "workspaces" / sid)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{daemon.url}/v1/tools/python/invoke",
                   json={"arguments": {"code": "while True:\n    pass"}, "session": sid,
                         "limits": {"timeout_s": 60}}, timeout=2.0)

    def cancelled() -> dict | None:
        done = [r for r in audit_records(daemon.audit_path, "result")
                if r.get("session") == sid and r.get("status") == "killed"]
        return done[0] if done else None

    record = wait_until(cancelled, timeout=60, what="the cancelled call's audit record")
    assert record["termination"]["reason"] == "cancelled", record
    assert record["kernel"]["interrupted"] is True and record["kernel"]["lost"] is False, record
    assert running(kernel)
    assert call(daemon, "w", sid)["value"] == "still here"


def test_an_interrupt_of_a_session_without_a_call_is_harmless(daemon: RunningDaemon,
                                                             tmp_path: Path) -> None:
    sid = session(daemon)
    resp = daemon.client.post(f"/v1/sessions/{sid}/interrupt")
    assert resp.status_code == 200 and resp.json()["interrupted"] == [], resp.text
    missing = daemon.client.post("/v1/sessions/ses_nope/interrupt")
    assert missing.status_code == 404, missing.text
