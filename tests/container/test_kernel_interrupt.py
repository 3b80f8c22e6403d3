"""Interrupt before kill (so a runaway call need not cost its state) on the container backend,
through a real daemon and a real Docker engine.

At a session call's wall-clock limit, on ``POST /v1/sessions/{id}/interrupt`` and when the
client goes away, the runner first sends the kernel SIGINT: a ``KeyboardInterrupt`` in the
call's code. A kernel that comes back to its loop (proven idle) within
``kernel_interrupt_grace_s`` keeps its variables (``kernel.interrupted``); code that ignores
the interrupt (catches it, or sits in C code) is killed after the grace: the kernel is lost
and the slot freed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.audit import audit_records
from tests.support.processes import running
from tests.support.wait import wait_until

from .test_kernel_trust import GRACE_S, Daemon, kernel_process, start


@pytest.fixture(scope="module")
def daemon(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    yield from start(docker_client, tmp_path_factory.mktemp("kernel-interrupt"))


def test_a_timeout_interrupts_and_the_variables_are_kept(daemon: Daemon,
                                                         docker_client: Any) -> None:
    sid = daemon.session()
    assert daemon.py("x = 41", sid)["status"] == "ok"
    kernel = kernel_process(docker_client, daemon, sid)
    res = daemon.py("while True:\n    pass", sid, timeout_s=2)
    assert res["status"] == "timeout", res
    assert res["termination"]["reason"] == "wall_timeout", res
    assert res["kernel"] == {"fresh": False, "calls": 2, "lost": False, "reason": None,
                             "interrupted": True}, res
    assert "KeyboardInterrupt" in res["stderr"] and "runner" not in res["stderr"], res
    assert "variables" in res["message"] and "kept" in res["message"], res
    assert res["cleanup"]["verified"] is True, res
    after = daemon.py("print(x + 1)", sid)
    assert after["status"] == "ok" and after["stdout"] == "42\n", after
    assert after["kernel"]["fresh"] is False and after["kernel"]["calls"] == 3, after
    assert running(kernel) and kernel_process(docker_client, daemon, sid).pid == kernel.pid
    assert daemon.d.client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_a_sleep_is_interrupted_too(daemon: Daemon) -> None:
    sid = daemon.session()
    assert daemon.py("import time\ny = 'kept'", sid)["status"] == "ok"
    res = daemon.py("time.sleep(60)", sid, timeout_s=1)
    assert res["status"] == "timeout" and res["kernel"]["interrupted"] is True, res
    assert daemon.py("y", sid)["value"] == "kept"
    assert daemon.d.client.delete(f"/v1/sessions/{sid}").status_code == 204


@pytest.mark.parametrize("code", [
    # (the loop's body is not a bare ``pass``: CPython 3.11 leaves ``while True: pass`` out
    # of its ``try``, so that interrupt would not be caught at all)
    "while True:\n    try:\n        while True:\n            n = 1\n"
    "    except KeyboardInterrupt:\n        pass",
    "sum(range(10 ** 13))",  # C code: no bytecode boundary for the interrupt to land on
])
def test_code_that_ignores_the_interrupt_is_killed_after_the_grace(
        daemon: Daemon, docker_client: Any, code: str) -> None:
    sid = daemon.session()
    assert daemon.py("x = 1", sid)["status"] == "ok"
    kernel = kernel_process(docker_client, daemon, sid)
    res = daemon.py(code, sid, timeout_s=1)
    assert res["status"] == "timeout", res
    assert res["kernel"]["lost"] is True and res["kernel"]["interrupted"] is False, res
    assert res["kernel"]["reason"] == "wall_timeout", res
    assert f"did not come back from the interrupt within {GRACE_S} s" in res["message"], res
    assert res["resources"]["wall_ms"] >= GRACE_S * 1000, res  # it had its grace
    assert res["cleanup"]["verified"] is True, res
    assert not running(kernel)
    # the slot is free and the session goes on with a fresh kernel
    fresh = daemon.py("x = 2\nx", sid)
    assert fresh["value"] == 2 and fresh["kernel"]["fresh"] is True, fresh
    assert daemon.d.client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_an_interrupt_request_ends_the_running_call_and_keeps_the_kernel(
        daemon: Daemon, docker_client: Any) -> None:
    sid = daemon.session()
    assert daemon.py("z = [1, 2]", sid)["status"] == "ok"
    kernel = kernel_process(docker_client, daemon, sid)
    cpu0 = kernel.cpu_times().user
    results: list[dict[str, Any]] = []
    caller = threading.Thread(target=lambda: results.append(
        daemon.py("print('started', flush=True)\nwhile True:\n    pass", sid, timeout_s=60)))
    caller.start()
    # the call runs once its kernel burns CPU (the request reached it)
    wait_until(lambda: kernel.cpu_times().user > cpu0 + 0.2, timeout=60,
               what="the call to run")
    resp = daemon.d.client.post(f"/v1/sessions/{sid}/interrupt")
    assert resp.status_code == 200, resp.text
    assert resp.json()["interrupted"] == ["container"], resp.json()
    caller.join(timeout=60)
    assert results, "the interrupted call never answered"
    res = results[0]
    assert res["status"] == "killed" and res["termination"]["reason"] == "cancelled", res
    assert res["kernel"] == {"fresh": False, "calls": 2, "lost": False, "reason": None,
                             "interrupted": True}, res
    assert res["stdout"].startswith("started") and "KeyboardInterrupt" in res["stderr"], res
    assert daemon.py("z", sid)["value"] == [1, 2]
    assert running(kernel)
    # nothing runs: a second interrupt finds no call
    again = daemon.d.client.post(f"/v1/sessions/{sid}/interrupt").json()
    assert again["interrupted"] == []
    events = audit_records(daemon.d.audit_path, "kernel_interrupt")
    assert [e["backends"] for e in events if e["session"] == sid] == [["container"], []]
    assert daemon.d.client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_a_client_that_disconnects_keeps_the_kernel(daemon: Daemon,
                                                   docker_client: Any) -> None:
    sid = daemon.session()
    assert daemon.py("w = 'still here'", sid)["status"] == "ok"
    kernel = kernel_process(docker_client, daemon, sid)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{daemon.d.url}/v1/tools/python/invoke",
                   json={"arguments": {"code": "while True:\n    pass"}, "session": sid,
                         "limits": {"timeout_s": 60}}, timeout=2.0)

    def cancelled() -> dict[str, Any] | None:
        done = [r for r in audit_records(daemon.d.audit_path, "result")
                if r.get("session") == sid and r.get("status") == "killed"]
        return done[0] if done else None

    record = wait_until(cancelled, timeout=60, what="the cancelled call's audit record")
    assert record["termination"]["reason"] == "cancelled", record
    assert record["kernel"]["interrupted"] is True and record["kernel"]["lost"] is False, record
    assert record["cleanup"]["verified"] is True, record
    assert running(kernel)
    res = daemon.py("w", sid)
    assert res["value"] == "still here" and res["kernel"]["fresh"] is False, res
    assert kernel_process(docker_client, daemon, sid).pid == kernel.pid
    assert daemon.d.client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_an_interrupt_of_a_session_without_a_call_is_harmless(daemon: Daemon) -> None:
    sid = daemon.session()
    resp = daemon.d.client.post(f"/v1/sessions/{sid}/interrupt")
    assert resp.status_code == 200 and resp.json()["interrupted"] == [], resp.text
    assert daemon.d.client.delete(f"/v1/sessions/{sid}").status_code == 204
