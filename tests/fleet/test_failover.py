"""A fleet losing a node: ``kill -9`` (its sessions get a problem naming it, the
others go on, new sessions avoid it) and SIGTERM (drained: no call lost, no new session
placed on it, its sessions' calls reach it until it stops).

A rolling restart of every node that loses no session: test_rolling_restart.py."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.support.fleet import CHECK_INTERVAL_MS, Fleet, running_fleet
from tests.support.wait import wait_until

SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(1.5)\nprint('done')"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One fleet for the module: each test takes down a node of its own (n1 drained, n2
    killed), in either order."""
    with running_fleet(tmp_path_factory.mktemp("fleet")) as f:
        yield f


def _live(fleet: Fleet) -> set[str]:
    return {n for n, d in fleet.nodes.items() if d.proc.poll() is None}


def _sessions(fleet: Fleet, count: int) -> dict[str, str]:
    """``count`` new sessions through the proxy: id -> node."""
    out = {}
    for _ in range(count):
        r = fleet.client.post("/v1/sessions", json={})
        assert r.status_code == 201, r.text
        out[r.json()["id"]] = r.json()["node"]
    return out


def _call(fleet: Fleet, sid: str) -> httpx.Response:
    return fleet.client.post(f"/v1/sessions/{sid}/tools/python/invoke",
                             json={"arguments": {"code": "print(3)"}})


def _node_unavailable(r: httpx.Response, node: str) -> bool:
    """The proxy's problem for a session whose node is down, naming the node."""
    return (r.status_code == 503
            and r.headers.get("content-type") == "application/problem+json"
            and r.json()["type"].endswith("/node-unavailable") and r.json()["node"] == node)


def test_a_killed_node_fails_its_sessions_only(fleet: Fleet) -> None:
    victim = "n2"
    sessions = _sessions(fleet, 12)
    assert victim in sessions.values()
    others = _live(fleet) - {victim}
    fleet.nodes[victim].proc.kill()
    fleet.nodes[victim].proc.wait(30)
    lost = [s for s, n in sessions.items() if n == victim]
    for sid in lost:  # within the check interval (a refused connection is not retried away)
        wait_until(lambda sid=sid: _node_unavailable(_call(fleet, sid), victim),
                   timeout=5, what=f"the problem naming {victim} for {sid}")
        r = fleet.client.get(f"/v1/sessions/{sid}/files/x.txt")
        assert _node_unavailable(r, victim), r.text
    for sid, node in sessions.items():
        if node != victim:
            r = _call(fleet, sid)
            assert r.status_code == 200 and r.json()["node"] == node, r.text
    fresh = _sessions(fleet, 12)  # placed on the live nodes only, none refused
    assert set(fresh.values()) == others, fresh
    r = fleet.client.post("/v1/tools/python/invoke", json={"arguments": {"code": "print(4)"}})
    assert r.status_code == 200 and r.json()["node"] != victim, r.text


class _InFlight(threading.Thread):
    """A streamed session call that prints ``started`` and then runs for 1.5 s."""

    def __init__(self, url: str, sid: str) -> None:
        super().__init__(daemon=True)
        self.url, self.sid = url, sid
        self.started = threading.Event()
        self.result: dict[str, object] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=60) as client, client.stream(
                    "POST", f"/v1/sessions/{self.sid}/tools/python/invoke",
                    json={"arguments": {"code": SLEEPER}},
                    headers={"accept": "text/event-stream"}) as r:
                event = ""
                for line in r.iter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:") and event == "stdout" and "started" in line:
                        self.started.set()
                    elif line.startswith("data:") and event == "result":
                        self.result = json.loads(line[5:])
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_a_draining_node_loses_no_call_and_gets_no_new_session(fleet: Fleet) -> None:
    victim = "n1"
    sessions = _sessions(fleet, 9)
    theirs = [s for s, n in sessions.items() if n == victim]
    assert theirs
    inflight = [_InFlight(fleet.url, sid) for sid in theirs[:2]]
    for call in inflight:
        call.start()
    for call in inflight:
        wait_until(lambda call=call: call.started.is_set() or call.error, timeout=60,
                   what="the in-flight call to run")
    daemon = fleet.nodes[victim]
    daemon.proc.send_signal(signal.SIGTERM)

    placed: list[str] = []
    answers: list[str] = []  # what the victim's own sessions got while it drained
    while daemon.proc.poll() is None:
        r = fleet.client.post("/v1/sessions", json={})
        assert r.status_code == 201, r.text  # no call lost: refused before it ran = retried
        placed.append(r.json()["node"])
        assert fleet.client.delete(f"/v1/sessions/{r.json()['id']}").status_code == 204
        r = fleet.client.post("/v1/tools/python/invoke", json={"arguments": {"code": "1"}})
        assert r.status_code == 200 and r.json()["node"] != victim, r.text
        r = _call(fleet, theirs[-1])
        if r.status_code == 200:
            answers.append(r.json()["node"])  # before the signal took effect: still its node
        elif not _node_unavailable(r, victim):  # it may just have stopped
            assert r.status_code == 503 and r.json()["type"].endswith("/draining"), r.text
            answers.append("draining")  # the node itself answered: the call reached it
    assert daemon.proc.wait(30) == 0
    assert placed and set(placed) <= _live(fleet), placed  # none on the draining node
    assert set(answers) <= {victim, "draining"} and answers, answers
    for call in inflight:  # the in-flight calls finished on their node
        call.join(30)
        assert call.error is None and call.result is not None, call.error
        assert (call.result["status"], call.result["node"]) == ("ok", victim)
        assert call.result["stdout"] == "started\ndone\n"
    for sid, node in sessions.items():  # the others' sessions: untouched
        if node != victim:
            assert _call(fleet, sid).json()["node"] == node
    wait_until(lambda: _node_unavailable(_call(fleet, theirs[-1]), victim),
               timeout=10 * CHECK_INTERVAL_MS / 1000, what="the stopped node's problem")
