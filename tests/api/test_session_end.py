"""A session's end ends its calls, through a real daemon and the restricted backend: a call
that waits (for the session's kernel, or for a slot) when its session is deleted or its
client revoked ends ``killed`` (``cancelled``) and never runs; the call that was running ends
the same way; nothing runs as the session's uid afterwards and its workspace is never made
again. And every cap admits exactly its worth of a burst (sessions per client, max_kernels);
the MCP session caps' burst is tests/mcp/test_session_caps.py's flood."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import psutil
from httpx_sse import connect_sse

from sandboxd.access.tokens import add_token
from tests.auth.test_revocation import revoked, token_cli
from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.wait import wait_until

SSE = {"Accept": "text/event-stream"}
#: a call that says it runs (a file in its workspace), then runs until it is ended
RUNS = "open('running', 'w').write('1')\nimport time\ntime.sleep(120)"
ENV = {"SANDBOXD_CONTAINER_ENABLED": "false"}


class Call(threading.Thread):
    """One call in a thread: ``begun`` is set once the daemon answers (a streamed call: once
    it holds its slot and its backend runs it), ``result`` is its result."""

    def __init__(self, d: RunningDaemon, body: dict[str, Any], *, stream: bool,
                 token: str | None = None) -> None:
        super().__init__(daemon=True)
        self.d, self.body, self.stream = d, body, stream
        self.headers = {"Authorization": f"Bearer {token}"} if token else d.headers
        self.begun = threading.Event()
        self.result: dict[str, Any] | None = None
        self.start()

    def run(self) -> None:
        with httpx.Client(base_url=self.d.url, headers=self.headers, timeout=180) as c:
            if not self.stream:
                r = c.post("/v1/tools/python/invoke", json=self.body)
                assert r.status_code == 200, r.text
                self.result = r.json()
                return
            with connect_sse(c, "POST", "/v1/tools/python/invoke", json=self.body,
                             headers=SSE) as src:
                assert src.response.status_code == 200, src.response.read()
                self.begun.set()
                for sse in src.iter_sse():
                    if sse.event == "result":
                        self.result = json.loads(sse.data)

    def outcome(self) -> dict[str, Any]:
        self.join(timeout=120)
        assert self.result is not None, "the call got no result"
        return self.result


def cancelled(result: dict[str, Any]) -> None:
    assert result["status"] == "killed", result
    assert result["termination"]["reason"] == "cancelled", result


def running_as(uid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["uids"]):
        uids = p.info["uids"]
        if uids is not None and uid in (uids.real, uids.effective):
            found.append(p)
    return found


def a_waiting_call(d: RunningDaemon, sid: str,
                   token: str | None = None) -> tuple[Call, Call, int, Path]:
    """A call of ``sid`` that runs in its kernel, and a second one that holds a slot and
    waits for that kernel; the session's uid and workspace."""
    workspace = d.state_dir / "workspaces" / sid
    uid = workspace.stat().st_uid
    running = Call(d, {"session": sid, "arguments": {"code": RUNS}}, stream=False,
                   token=token)
    wait_until(lambda: (workspace / "running").exists(), timeout=60,
               what="the first call to run", detail=lambda: d.log()[-2000:])
    queued = Call(d, {"session": sid, "arguments": {"code": "open('late', 'w')"}},
                  stream=True, token=token)
    assert queued.begun.wait(60), "the second call never held a slot"
    return running, queued, uid, workspace


def assert_ended(d: RunningDaemon, calls: list[Call], uid: int, workspace: Path) -> None:
    for call in calls:
        cancelled(call.outcome())
    assert running_as(uid) == []
    assert not workspace.exists()  # never made again by a late call
    audited = {r["invocation"]: r for r in audit_records(d.audit_path, "result")}
    for call in calls:
        assert call.result is not None
        cancelled(audited[call.result["id"]])


def test_delete_cancels_the_running_and_the_waiting_call(tmp_path: Path) -> None:
    with running_daemon(tmp_path, env=ENV) as d:
        sid = d.client.post("/v1/sessions").json()["id"]
        running, queued, uid, workspace = a_waiting_call(d, sid)
        assert d.client.delete(f"/v1/sessions/{sid}").status_code == 204
        # the DELETE returned once both calls were over: nothing of the session is left
        assert_ended(d, [running, queued], uid, workspace)
        assert queued.result is not None and "session ended" in (queued.result["message"]
                                                                 or ""), queued.result
        assert not (d.state_dir / "sessions" / f"{sid}.json").exists()
        assert d.client.get(f"/v1/sessions/{sid}").status_code == 404
        # the daemon goes on: a new session runs (its kernel's place under max_kernels
        # and its uid free again)
        fresh = d.client.post("/v1/sessions").json()["id"]
        r = d.invoke("python", {"code": "x = 1\nx"}, session=fresh)
        assert r.json()["value"] == 1, r.text


def test_a_call_waiting_for_a_slot_when_its_client_is_revoked(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    alice = add_token(tokens, "alice")
    env = {**ENV, "SANDBOXD_TOKENS_FILE": str(tokens), "SANDBOXD_MAX_CONCURRENCY": "1"}
    with running_daemon(tmp_path, env=env, token=alice) as d:
        sid = d.client.post("/v1/sessions").json()["id"]
        workspace = d.state_dir / "workspaces" / sid
        uid = workspace.stat().st_uid
        running = Call(d, {"session": sid, "arguments": {"code": RUNS}}, stream=False)
        wait_until(lambda: (workspace / "running").exists(), timeout=60,
                   what="the first call to run", detail=lambda: d.log()[-2000:])
        queued = Call(d, {"session": sid, "arguments": {"code": "open('late', 'w')"}},
                      stream=False)
        wait_until(lambda: "sandboxd_queue_depth 1.0" in d.client.get("/metrics").text,
                   timeout=60, what="the second call to wait for the only slot")

        token_cli("remove", "alice", "--tokens-file", str(tokens))

        record = revoked(d, "alice")
        assert [s["id"] for s in record["sessions"]] == [sid] and record["verified"]
        assert_ended(d, [running, queued], uid, workspace)
        assert queued.result is not None
        assert queued.result["cleanup"]["detail"] == "cancelled before it started"


def test_session_creation_burst_admits_exactly_the_cap(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    alice, bob = add_token(tokens, "alice"), add_token(tokens, "bob")
    env = {**ENV, "SANDBOXD_TOKENS_FILE": str(tokens), "SANDBOXD_MAX_SESSIONS_PER_CLIENT": "4"}
    with running_daemon(tmp_path, env=env, token=alice) as d:
        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=d.url, headers=d.headers,
                                         timeout=120) as c:
                return list(await asyncio.gather(*(c.post("/v1/sessions")
                                                   for _ in range(150))))

        codes = sorted(r.status_code for r in asyncio.run(burst()))
        assert codes == [201] * 4 + [409] * 146, codes
        assert len(d.client.get("/v1/sessions").json()) == 4
        assert len(list((d.state_dir / "workspaces").iterdir())) == 4
        # another client still gets its sessions
        with httpx.Client(base_url=d.url, headers={"Authorization": f"Bearer {bob}"},
                          timeout=60) as c:
            assert c.post("/v1/sessions").status_code == 201


def test_kernel_burst_admits_exactly_max_kernels(tmp_path: Path) -> None:
    env = {**ENV, "SANDBOXD_MAX_KERNELS": "3", "SANDBOXD_MAX_SESSIONS_PER_CLIENT": "10",
           "SANDBOXD_MAX_CONCURRENCY": "10", "SANDBOXD_QUEUE_SIZE": "64"}
    with running_daemon(tmp_path, env=env) as d:
        sids = [d.client.post("/v1/sessions").json()["id"] for _ in range(8)]

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=d.url, headers=d.headers,
                                         timeout=120) as c:
                return list(await asyncio.gather(*(
                    c.post("/v1/tools/python/invoke",
                           json={"session": s, "arguments": {"code": "x = 1"}})
                    for s in sids)))

        answers = asyncio.run(burst())
        codes = sorted(r.status_code for r in answers)
        assert codes == [200] * 3 + [429] * 5, [r.text for r in answers]
        live = [s for s in d.client.get("/v1/sessions").json() if s["kernel"]["live"]]
        assert len(live) == 3
