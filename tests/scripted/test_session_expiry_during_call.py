"""A session does not expire while one of its calls runs, however long the call outlasts the
session's TTL: the expiry loop passes it by (its kernel is not ended under the call), the
session answers meanwhile (an interrupt or a second call finds it), and its TTL counts again
from the call's end. An idle session beside it, created at the same time with the same TTL,
is expired by the same loop: that is the event the test waits for."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime
from typing import Any

from sandboxd.backends.scripted import NOTHING_TO_CLEAN, ScriptedBackend
from sandboxd.models import Invocation, Limits, Reason, Result
from tests.support.wait import wait_until

from .test_service_on_scripted import make  # noqa: F401  (the fixture)

TTL_S = 0.4  # the sessions' own; the daemon's is 2 s, so its expiry loop runs every 0.5 s


def test_a_session_with_a_call_running_does_not_expire(make) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    release = threading.Event()
    running = threading.Event()

    async def waits(call: Invocation, limits: Limits) -> Result:
        if call.arguments.get("code") == "wait":
            running.set()
            await asyncio.to_thread(release.wait, 60)
        return Result.build(call, None, Reason.exited, exit_code=0, stdout="done\n",
                            limits=limits, cleanup=NOTHING_TO_CLEAN)

    d = make(ScriptedBackend(script=waits), session_ttl_s=2.0)
    busy = d.client.post("/v1/sessions", json={"ttl_s": TTL_S}).json()["id"]
    idle = d.client.post("/v1/sessions", json={"ttl_s": TTL_S}).json()["id"]
    answer: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: answer.update(
        d.invoke("python", {"code": "wait"}, session=busy, limits={"timeout_s": 60}).json()))
    worker.start()
    try:
        assert running.wait(30), "the long call never reached the backend"
        # the expiry loop ran past both TTLs: it ended the idle session, not the busy one
        wait_until(lambda: expired(d) == [idle], timeout=30, what="the idle session to expire",
                   detail=lambda: expired(d))
        assert d.client.get(f"/v1/sessions/{idle}").status_code == 404
        assert busy not in d.python.closed_sessions
        view = d.client.get(f"/v1/sessions/{busy}")
        assert view.status_code == 200, view.text
        assert view.json()["expires_at"] < time.time()  # its TTL ran out under the call
        assert busy in {s["id"] for s in d.client.get("/v1/sessions").json()}
        # a second call of the session is served meanwhile
        second = d.invoke("python", {"code": "x"}, session=busy)
        assert second.status_code == 200 and second.json()["stdout"] == "done\n", second.text
    finally:
        released = time.time()  # the call ends after this
        release.set()
        worker.join(60)
    assert answer.get("status") == "ok" and answer.get("session") == busy, answer
    # its TTL counts again from the call's end: it expires once idle for that long, as any
    # session does, after the call's result (the records, in order)
    wait_until(lambda: expired(d) == [idle, busy], timeout=30,
               what="the session to expire once idle", detail=lambda: expired(d))
    records = d.records()
    result = next(r for r in records if r["event"] == "result" and r["request_id"] == answer["id"])
    ended = next(r for r in records if r["event"] == "session_expired" and r["session"] == busy)
    assert result["seq"] < ended["seq"]
    assert datetime.fromisoformat(ended["ts"]).timestamp() >= released + TTL_S, (released, ended)
    assert d.client.get(f"/v1/sessions/{busy}").status_code == 404
    assert busy in d.python.closed_sessions


def expired(d: Any) -> list[str]:
    """The sessions the daemon's expiry ended, in order (its audit records)."""
    return [r["session"] for r in d.records() if r["event"] == "session_expired"]


class SlowRestart(ScriptedBackend):
    """A scripted backend whose kernel restarts wait for the test's word."""

    def __init__(self) -> None:
        super().__init__()
        self.restarting = threading.Event()
        self.release = threading.Event()

    async def restart_kernel(self, session_id: str) -> bool:
        self.restarting.set()
        await asyncio.to_thread(self.release.wait, 60)
        return await super().restart_kernel(session_id)


def test_a_session_does_not_expire_under_a_kernel_restart(make) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    backend = SlowRestart()
    d = make(backend, session_ttl_s=2.0)
    busy = d.client.post("/v1/sessions", json={"ttl_s": TTL_S}).json()["id"]
    idle = d.client.post("/v1/sessions", json={"ttl_s": TTL_S}).json()["id"]
    answer: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: answer.update(
        d.client.post(f"/v1/sessions/{busy}/restart").json()))
    worker.start()
    try:
        assert backend.restarting.wait(30), "the restart never reached the backend"
        wait_until(lambda: expired(d) == [idle], timeout=30, what="the idle session to expire",
                   detail=lambda: expired(d))
        assert d.client.get(f"/v1/sessions/{busy}").status_code == 200
    finally:
        backend.release.set()
        worker.join(60)
    assert answer.get("id") == busy and answer.get("restarted") == [], answer  # no kernel yet
    events = [(r["event"], r.get("session")) for r in d.records()]
    assert ("kernel_restart", busy) in events, events
