"""Streamed invoke (output while a long call runs): ``Accept: text/event-stream`` through a real
daemon (uvicorn on a real socket, the restricted backend), read with httpx-sse as any SSE client
would; refusals, which come before any call runs, on the daemon's app in process
(tests/support/inprocess.py)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse

from sandboxd.backends.scripted import sleeps
from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon
from tests.support.inprocess import InProcessDaemon, answers, inprocess_daemon
from tests.support.processes import busy_descendants, running
from tests.support.wait import wait_until

SSE = {"Accept": "text/event-stream"}
PRINT_SLEEP_PRINT = "import time\nprint('a', flush=True)\ntime.sleep(1)\nprint('b')"


@pytest.fixture
def daemon(module_daemon: RunningDaemon) -> RunningDaemon:
    """This module's tests share one daemon (tests/conftest.py: module_daemon)."""
    return module_daemon


def stream(d: RunningDaemon | InProcessDaemon, body: dict[str, Any],
           ) -> list[tuple[float, str, Any]]:
    """Every event of one streamed call: (arrival time, kind, data)."""
    events: list[tuple[float, str, Any]] = []
    with httpx.Client(base_url=d.url, headers=d.headers, timeout=60,
                      transport=getattr(d, "transport", None)) as c, \
            connect_sse(c, "POST", "/v1/tools/python/invoke", json=body, headers=SSE) as src:
        assert src.response.status_code == 200
        assert src.response.headers["content-type"].startswith("text/event-stream")
        assert src.response.headers["cache-control"] == "no-store"
        for sse in src.iter_sse():
            events.append((time.monotonic(), sse.event, json.loads(sse.data)))
    return events


def text_of(events: list[tuple[float, str, Any]], kind: str) -> str:
    return "".join(data["text"] for _, k, data in events if k == kind)


def test_output_arrives_while_the_call_runs(daemon: RunningDaemon) -> None:
    events = stream(daemon, {"arguments": {"code": PRINT_SLEEP_PRINT + "\ndisplay([3])\n7"}})
    kinds = [k for _, k, _ in events]
    assert kinds[-1] == "result" and kinds.count("result") == 1, kinds
    first_stdout = next(t for t, k, _ in events if k == "stdout")
    result_at, _, result = events[-1]
    assert result_at - first_stdout >= 0.8, (result_at - first_stdout, kinds)
    assert result["status"] == "ok" and result["value"] == 7
    assert text_of(events, "stdout") == result["stdout"] == "a\nb\n"
    displays = [data for _, k, data in events if k == "display"]
    assert displays == result["outputs"] and displays[0]["data"]["application/json"] == [3]


def test_the_stream_holds_no_more_than_the_output_cap(daemon: RunningDaemon) -> None:
    events = stream(daemon, {"arguments": {"code": "print('x' * 5000)\nprint('é' * 3000)"},
                             "limits": {"output_bytes": 4096}})
    result = events[-1][2]
    assert result["status"] == "killed" and result["termination"]["reason"] == "output_limit"
    streamed = text_of(events, "stdout")
    assert len(streamed.encode()) <= 4096
    assert result["stdout"].startswith(streamed[:4000]) and result["truncated"]["stdout"]


def test_a_session_kernel_streams_too(daemon: RunningDaemon) -> None:
    sid = daemon.client.post("/v1/sessions").json()["id"]
    try:
        first = stream(daemon, {"arguments": {"code": "n = 40"}, "session": sid})
        assert first[-1][2]["kernel"]["fresh"] is True
        events = stream(daemon, {"arguments": {"code": "print(n + 2)"}, "session": sid})
        assert text_of(events, "stdout") == "42\n"
        assert events[-1][2]["kernel"] == {"fresh": False, "calls": 2, "lost": False,
                                           "reason": None, "interrupted": False}
    finally:
        daemon.client.delete(f"/v1/sessions/{sid}")


def test_refusals_before_the_call_runs_are_problem_json(inproc: InProcessDaemon) -> None:
    daemon = inproc
    daemon.python.script = answers(value=1)
    for path, body, status in (
            ("/v1/tools/nope/invoke", {"arguments": {}}, 404),
            ("/v1/tools/python/invoke", {"arguments": {"code": 5}}, 422)):
        r = daemon.client.post(path, json=body, headers=SSE)
        assert r.status_code == status, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
    # a policy denial is a call's result: one result event
    events = stream(daemon, {"arguments": {"code": "import os"}})
    assert [k for _, k, _ in events] == ["result"] and events[0][2]["status"] == "denied"
    # without the header nothing changes
    r = daemon.client.post("/v1/tools/python/invoke", json={"arguments": {"code": "1"}})
    assert r.headers["content-type"] == "application/json" and r.json()["value"] == 1


def test_a_client_that_disconnects_mid_stream_cancels_the_call(daemon: RunningDaemon) -> None:
    daemon.invoke("python", {"code": "1"})  # the zygote exists now
    code = "print('started', flush=True)\nwhile True:\n    pass"
    with httpx.Client(base_url=daemon.url, headers=daemon.headers, timeout=60) as c, \
            connect_sse(c, "POST", "/v1/tools/python/invoke", headers=SSE,
                        json={"arguments": {"code": code}, "limits": {"timeout_s": 60}}) as src:
        events = src.iter_sse()  # held: dropping the iterator would close the response
        first = next(events)
        assert first.event == "stdout" and json.loads(first.data)["text"] == "started\n"
        # measured over one-second windows until one shows it: on a loaded machine the busy
        # loop may get less than a quarter of a CPU in a given second
        busy = wait_until(lambda: busy_descendants(daemon.proc.pid), timeout=60,
                          what="the call's busy loop to show in a process of the daemon")
        worker = busy[0]  # the busiest: a standby worker setting itself up burns far less
    # the connection is closed: the call is cancelled, its worker killed and reaped (the
    # very processes: the zygote forks standby workers at moments of its own, so a count of
    # processes would not do)
    wait_until(lambda: not running(worker), timeout=15,
               what=f"the worker of the cancelled call to end: {worker}")
    cancelled: list[dict[str, Any]] = wait_until(
        lambda: [r for r in audit_records(daemon.audit_path) if r.get("event") == "result"
                 and r.get("termination", {}).get("reason") == "cancelled"],
        timeout=15, what="an audit record of the cancelled call")
    assert cancelled[-1]["cleanup"]["verified"] is True, cancelled


def _queue(d: InProcessDaemon) -> tuple[float, float]:
    """(calls queued, slots in use), as /metrics says."""
    text = d.client.get("/metrics").text
    depth = re.search(r"^sandboxd_queue_depth ([0-9.]+)$", text, re.MULTILINE)
    slots = re.search(r"^sandboxd_slots_in_use ([0-9.]+)$", text, re.MULTILINE)
    assert depth and slots, text
    return float(depth.group(1)), float(slots.group(1))


@pytest.fixture
def busy_daemon(tmp_path: Path) -> Iterator[InProcessDaemon]:
    """One slot, one place in the queue; every call takes 2 s."""
    env = {"SANDBOXD_MAX_CONCURRENCY": "1", "SANDBOXD_QUEUE_SIZE": "1"}
    with inprocess_daemon(tmp_path, env=env, script=sleeps(2)) as d:
        yield d


def test_a_full_queue_is_429_problem_json_for_a_streaming_caller(
        busy_daemon: InProcessDaemon) -> None:
    slow = {"arguments": {"code": "import time\ntime.sleep(2)"}}
    ready = threading.Barrier(3)

    def occupy(_: int) -> int:
        ready.wait()
        return busy_daemon.client.post("/v1/tools/python/invoke", json=slow).status_code

    with ThreadPoolExecutor(2) as pool:
        running = [pool.submit(occupy, i) for i in range(2)]
        ready.wait()
        wait_until(lambda: _queue(busy_daemon) == (1, 1), timeout=30,
                   what="one call running and one waiting in the queue")
        r = busy_daemon.client.post("/v1/tools/python/invoke", json=slow, headers=SSE)
        assert r.status_code == 429, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert int(r.headers["retry-after"]) >= 1
        assert sorted(f.result() for f in running) == [200, 200]
