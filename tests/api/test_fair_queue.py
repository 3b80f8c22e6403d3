"""Fair queueing through the daemon's app with tokens (in process, on a scripted backend:
tests/support/inprocess.py): one client that keeps every slot busy and floods the queue cannot
starve another client; the other always gets a place."""

from __future__ import annotations

import asyncio
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from sandboxd.access.tokens import add_token
from sandboxd.models import Invocation, Limits, Result
from tests.support.inprocess import InProcessDaemon, answers, by_code, inprocess_daemon
from tests.support.wait import wait_until

# Only the two calls that hold the slots are slow: they hold them until the test has seen
# carol get her place (HOLD_S at most). Every queued call is quick.
HOLD_S = 30.0
HOLD = "hold the slot"
QUICK = "6 * 7"


def _gauge(d: InProcessDaemon, name: str) -> float:
    text = d.client.get("/metrics").text
    match = re.search(rf"^{name} ([0-9.]+)$", text, re.MULTILINE)
    assert match, text
    return float(match.group(1))


def _wait_for(d: InProcessDaemon, queued: int, running: int) -> None:
    wait_until(lambda: (_gauge(d, "sandboxd_queue_depth"), _gauge(d, "sandboxd_slots_in_use"))
               == (queued, running), timeout=20,
               what=f"{queued} calls queued and {running} slots in use")


def test_a_flooding_client_cannot_starve_another(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    keys = {name: add_token(tokens, name) for name in ("alice", "bob", "carol")}
    env = {"SANDBOXD_TOKENS_FILE": str(tokens), "SANDBOXD_MAX_CONCURRENCY": "2",
           "SANDBOXD_QUEUE_SIZE": "6", "SANDBOXD_RATE_LIMIT_PER_MINUTE": "0",
           "SANDBOXD_QUEUE_TIMEOUT_S": "300"}
    release = threading.Event()

    async def hold(call: Invocation, limits: Limits) -> Result:
        await asyncio.to_thread(release.wait, HOLD_S)
        return answers()(call, limits)  # type: ignore[return-value]

    script = by_code({HOLD: hold}, default=answers(value=42))
    with inprocess_daemon(tmp_path, env=env, token=keys["alice"], script=script) as d, \
            ThreadPoolExecutor(16) as pool:
        def call(who: str, code: str = QUICK) -> httpx.Response:
            return d.client.post("/v1/tools/python/invoke", timeout=300,
                                 json={"arguments": {"code": code}},
                                 headers={"Authorization": f"Bearer {keys[who]}"})

        try:
            # alice takes both slots ...
            holding = [pool.submit(call, "alice", HOLD) for _ in range(2)]
            _wait_for(d, queued=0, running=2)
            # ... and tries to fill the queue: she gets half of it
            alice = [pool.submit(call, "alice") for _ in range(8)]
            wait_until(lambda: sum(f.done() for f in alice) >= 5, timeout=20,
                       what="5 of alice's calls refused")
            refused = [f.result() for f in alice if f.done()]
            assert [r.status_code for r in refused] == [429] * 5
            assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
            assert "per client" in refused[0].json()["detail"]
            _wait_for(d, queued=3, running=2)
            # bob still finds places, and fills the rest of the queue
            bob = [pool.submit(call, "bob") for _ in range(3)]
            _wait_for(d, queued=6, running=2)
            # the queue is full, yet carol, with nothing queued, gets a place: the newest
            # call of a client holding more places than she does gives its place up
            carol = pool.submit(call, "carol")
            wait_until(lambda: sum(f.done() for f in alice) >= 6, timeout=20,
                       what="a call of alice's giving carol its place")
            assert not any(f.done() for f in holding), \
                "a slot came free before carol arrived: the queue was never full for her"
            release.set()
            given_up = [f.result().json()["detail"] for f in alice
                        if f.done() and f.result().status_code == 429]
            assert sum("gave its place to another client's" in g for g in given_up) == 1, \
                given_up
            assert carol.result().status_code == 200, carol.result().text
            assert carol.result().json()["status"] == "ok"
            assert [f.result().status_code for f in bob] == [200] * 3
            assert [f.result().status_code for f in holding] == [200] * 2
            alice_codes = sorted(f.result().status_code for f in alice)
            assert alice_codes == [200] * 2 + [429] * 6, alice_codes
        finally:
            release.set()
