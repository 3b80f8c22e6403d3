"""Session kernels through the HTTP API on the scripted backend (no real sandbox needed): the
service's side
of them (kernel objects and the lost message, restart, the sessions list, the host-wide cap).
The backends' own kernels are proven by their suites; the scripted backend emulates one the
way they keep it (a live kernel per session python call, ended by a timeout or a limit)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandboxd.backends.scripted import ScriptedBackend, prints
from sandboxd.models import Invocation, Limits, Result
from tests.scripted.test_service_on_scripted import Daemon


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Daemons on scripted backends (closed at the end of the test)."""
    opened: list[Daemon] = []

    def factory(python: ScriptedBackend, **overrides: object) -> Daemon:
        d = Daemon(tmp_path, python, **overrides)
        d.client.__enter__()
        opened.append(d)
        return d

    yield factory
    for d in opened:
        d.client.__exit__(None, None, None)


def hangs_on(word: str):  # type: ignore[no-untyped-def]
    """A script that prints 'ok', except for code ``word``, which sleeps past any deadline."""
    ok = prints("ok\n")

    async def script(call: Invocation, limits: Limits) -> Result:
        if call.arguments.get("code") == word:
            await asyncio.sleep(60)  # sleep-ok: a test double that hangs past any deadline
        return ok(call, limits)  # type: ignore[return-value]

    return script


def test_session_calls_carry_their_kernel_and_one_shot_calls_none(make) -> None:  # type: ignore[no-untyped-def]
    d = make(ScriptedBackend(script=prints("ok\n")))
    sid = d.client.post("/v1/sessions").json()["id"]
    first = d.invoke("python", {"code": "x = 41"}, session=sid).json()
    second = d.invoke("python", {"code": "x + 1"}, session=sid).json()
    assert first["kernel"] == {"fresh": True, "calls": 1, "lost": False, "reason": None,
                            "interrupted": False}
    assert second["kernel"] == {"fresh": False, "calls": 2, "lost": False, "reason": None,
                            "interrupted": False}
    assert d.invoke("python", {"code": "1"}).json()["kernel"] is None
    # the file tools do not run in a kernel
    assert d.invoke("write_file", {"path": "f", "content": "x"}, session=sid).json()[
        "kernel"] is None
    view = d.client.get(f"/v1/sessions/{sid}").json()
    assert view["kernel"] == {"live": True, "backends": ["restricted"]}


def test_a_lost_kernel_tells_the_model_and_the_next_call_starts_fresh(make) -> None:  # type: ignore[no-untyped-def]
    backend = ScriptedBackend(script=hangs_on("hang"))
    d = make(backend)
    sid = d.client.post("/v1/sessions").json()["id"]
    assert d.invoke("python", {"code": "x = 1"}, session=sid).json()["kernel"]["fresh"]
    lost = d.invoke("python", {"code": "hang"}, session=sid, limits={"timeout_s": 0.3}).json()
    assert lost["status"] == "timeout"
    assert lost["kernel"] == {"fresh": False, "calls": 2, "lost": True,
                              "reason": "wall_timeout", "interrupted": False}
    assert lost["message"].startswith("the session's Python state was lost because the call "
                                      "exceeded its wall-clock limit of 0.3 s")
    assert "files are kept" in lost["message"]
    assert backend.kernel_sessions() == set()
    assert d.client.get(f"/v1/sessions/{sid}").json()["kernel"] == {"live": False,
                                                                    "backends": []}
    again = d.invoke("python", {"code": "x"}, session=sid).json()
    assert again["status"] == "ok" and again["message"] is None
    assert again["kernel"] == {"fresh": True, "calls": 1, "lost": False, "reason": None,
                            "interrupted": False}
    results = [r for r in d.records() if r["event"] == "result" and r.get("session") == sid]
    assert len(results) == 3


def test_restart_ends_the_kernel_is_audited_and_keeps_the_session(make) -> None:  # type: ignore[no-untyped-def]
    backend = ScriptedBackend(script=prints("ok\n"))
    d = make(backend)
    sid = d.client.post("/v1/sessions").json()["id"]
    none = d.client.post(f"/v1/sessions/{sid}/restart")
    assert none.status_code == 200, none.text
    assert none.json()["restarted"] == [] and none.json()["id"] == sid
    d.invoke("python", {"code": "x = 1"}, session=sid)
    d.invoke("python", {"code": "x += 1"}, session=sid)
    r = d.client.post(f"/v1/sessions/{sid}/restart")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["restarted"] == ["restricted"]
    assert body["kernel"] == {"live": False, "backends": []}
    assert d.invoke("python", {"code": "x"}, session=sid).json()["kernel"]["fresh"] is True
    events = [(r["event"], r.get("backends")) for r in d.records()
              if r["event"] == "kernel_restart"]
    assert events == [("kernel_restart", []), ("kernel_restart", ["restricted"])]
    assert backend.restarts.count(sid) == 2 and d.container.restarts.count(sid) == 2
    missing = d.client.post("/v1/sessions/ses_nope/restart")
    assert missing.status_code == 404
    assert missing.headers["content-type"].startswith("application/problem+json")


def test_sessions_are_listed_to_their_owner_only(tmp_path: Path) -> None:
    from sandboxd.access.tokens import add_token

    tokens = tmp_path / "tokens.yaml"
    alice = {"Authorization": f"Bearer {add_token(tokens, 'alice')}"}
    bob = {"Authorization": f"Bearer {add_token(tokens, 'bob')}"}
    d = Daemon(tmp_path, ScriptedBackend(script=prints("ok\n")), tokens_file=tokens)
    with d.client as c:
        assert c.get("/v1/sessions", headers=alice).json() == []
        one = c.post("/v1/sessions", headers=alice).json()["id"]
        two = c.post("/v1/sessions", headers=alice).json()["id"]
        theirs = c.post("/v1/sessions", headers=bob).json()["id"]
        body = {"arguments": {"path": "f", "content": "12345"}, "session": two}
        assert c.post("/v1/tools/write_file/invoke", json=body, headers=alice).json()[
            "status"] == "ok"
        body = {"arguments": {"code": "x = 1"}, "session": one}
        assert c.post("/v1/tools/python/invoke", json=body, headers=alice).status_code == 200
        listed = c.get("/v1/sessions", headers=alice).json()
        assert [s["id"] for s in listed] == [one, two]
        assert all(s["client"] == "alice" for s in listed)
        assert listed[0]["kernel"] == {"live": True, "backends": ["restricted"]}
        assert listed[1]["kernel"] == {"live": False, "backends": []}
        assert listed[1]["workspace_bytes"] >= 5
        assert listed[0]["expires_at"] > listed[0]["created_at"]
        assert [s["id"] for s in c.get("/v1/sessions", headers=bob).json()] == [theirs]
        # bob can neither restart alice's session nor learn that it exists
        assert c.post(f"/v1/sessions/{one}/restart", headers=bob).status_code == 404
        assert c.get(f"/v1/sessions/{one}", headers=alice).json()["kernel"]["live"] is True
        assert c.delete(f"/v1/sessions/{one}", headers=alice).status_code == 204
        assert [s["id"] for s in c.get("/v1/sessions", headers=alice).json()] == [two]


def _concurrently(d: Daemon, calls: list[dict]) -> list[int]:  # type: ignore[type-arg]
    statuses: list[int] = [0] * len(calls)

    def call(i: int) -> None:
        statuses[i] = d.invoke("python", {"code": "x"}, **calls[i]).status_code

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def test_the_kernel_cap_holds_under_concurrency(make) -> None:  # type: ignore[no-untyped-def]
    from sandboxd.backends.scripted import sleeps

    # two slots: the calls queue, so only the reservations taken at admission (not the
    # backend's own count, which grows once a call runs) can keep the cap
    backend = ScriptedBackend(script=sleeps(0.4))
    d = make(backend, max_kernels=3, max_concurrency=2, max_sessions_per_client=16)
    sids = [d.client.post("/v1/sessions").json()["id"] for _ in range(5)]
    statuses = _concurrently(d, [{"session": s} for s in sids])
    assert sorted(statuses) == [200, 200, 200, 429, 429], statuses
    assert len(backend.calls) == 3  # the refused calls ran nothing
    assert len(backend.kernel_sessions()) == 3
    refused = [s for s, code in zip(sids, statuses, strict=True) if code == 429]
    r = d.invoke("python", {"code": "x"}, session=refused[0])
    assert r.status_code == 429
    problem = r.json()
    assert r.headers["content-type"].startswith("application/problem+json")
    assert problem["type"].endswith("/too-many-kernels")
    assert "max_kernels = 3" in problem["detail"]
    rejected = [x for x in d.records() if x["event"] == "result" and x["status"] == "rejected"]
    assert {x["session"] for x in rejected} == set(refused) and len(rejected) == 3
    # at the cap: sessions with a live kernel, one-shot calls and file tools still work
    admitted = [s for s in sids if s not in refused]
    assert d.invoke("python", {"code": "x"}, session=admitted[0]).status_code == 200
    assert d.invoke("python", {"code": "x"}).status_code == 200
    assert d.invoke("write_file", {"path": "f", "content": "x"},
                    session=refused[0]).status_code == 200
    # a deleted session frees its kernel
    assert d.client.delete(f"/v1/sessions/{admitted[1]}").status_code == 204
    assert d.invoke("python", {"code": "x"}, session=refused[0]).status_code == 200


def test_concurrent_calls_of_one_session_share_its_kernel_at_the_cap(make) -> None:  # type: ignore[no-untyped-def]
    from sandboxd.backends.scripted import sleeps

    d = make(ScriptedBackend(script=sleeps(0.3)), max_kernels=1)
    one, two = (d.client.post("/v1/sessions").json()["id"] for _ in range(2))
    statuses = _concurrently(d, [{"session": one}, {"session": one}, {"session": two}])
    # whichever session won the one kernel, both calls of that session share it
    assert statuses in ([200, 200, 429], [429, 429, 200]), statuses
