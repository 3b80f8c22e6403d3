"""The HTTP API and the service on the scripted in-process backend: fast, no root, no Docker,
no processes. The real backends' suites (tests/restricted, tests/container, tests/security)
prove confinement; these prove the API and service logic around any backend."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from sandboxd.api.app import create_app
from sandboxd.audit import verify
from sandboxd.backends.scripted import ScriptedBackend, fails, prints, sleeps
from sandboxd.backends.workspace.backend import WorkspaceBackend
from sandboxd.config import Settings
from sandboxd.models import Decision, Invocation, Reason, Result
from sandboxd.protocol.display import DisplayCaps
from sandboxd.service import Sandboxd
from tests.support.audit import audit_records


def settings_for(tmp_path: Path, **overrides: object) -> Settings:
    return Settings(state_dir=tmp_path / "state", workspace_quota="advisory",
                    restricted_enabled=True, container_enabled=True, warm_pool_size=0,
                    **overrides)  # type: ignore[arg-type]


class Daemon:
    """An in-process daemon on scripted backends, behind Starlette's TestClient."""

    def __init__(self, tmp_path: Path, python: ScriptedBackend,
                 container: ScriptedBackend | None = None, **overrides: object) -> None:
        self.settings = settings_for(tmp_path, **overrides)
        self.python = python
        self.container = container or ScriptedBackend("container")
        self.service = Sandboxd(self.settings, backends={
            "workspace": WorkspaceBackend(quota_bytes=1 << 20, quota_entries=1000),
            "restricted": python,
            "container": self.container})
        self.client = TestClient(create_app(self.settings, service=self.service),
                                 base_url="http://localhost")

    def invoke(self, tool: str, arguments: dict, **body: object):  # type: ignore[no-untyped-def]
        return self.client.post(f"/v1/tools/{tool}/invoke",
                                json={"arguments": arguments, **body})

    def records(self) -> list[dict]:
        return audit_records(self.settings.audit_path)


@pytest.fixture
def make(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    opened: list[TestClient] = []

    def factory(python: ScriptedBackend, **kw: object) -> Daemon:
        d = Daemon(tmp_path, python, **kw)
        d.client.__enter__()
        opened.append(d.client)
        return d

    yield factory
    for client in opened:
        client.__exit__(None, None, None)


def test_a_call_reaches_the_backend_and_is_audited(make) -> None:  # type: ignore[no-untyped-def]
    d = make(ScriptedBackend(script=prints("42\n")))
    r = d.invoke("python", {"code": "print(6*7)"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ok" and body["stdout"] == "42\n"
    assert body["backend"] == "restricted" and body["cleanup"]["verified"] is True
    (call,) = d.python.calls
    assert call.arguments == {"code": "print(6*7)"} and call.client == "local"
    assert "math" in call.plan.imports_allow  # the policy's import list reached the backend
    events = [(r["event"], r.get("status") or r.get("decision")) for r in d.records()
              if r["event"] in ("decision", "result")]
    assert events == [("decision", "allow"), ("result", "ok")]


def test_a_denied_call_never_reaches_the_backend(make) -> None:  # type: ignore[no-untyped-def]
    d = make(ScriptedBackend(script=prints("ran\n")))
    r = d.invoke("shell", {"command": "curl http://example.com"})
    assert r.status_code == 200 and r.json()["status"] == "denied"
    assert d.container.calls == [] and d.python.calls == []


def test_a_backend_outliving_the_deadline_ends_as_a_timeout(make) -> None:  # type: ignore[no-untyped-def]
    d = make(ScriptedBackend(script=sleeps(30)))
    r = d.invoke("python", {"code": "x"}, limits={"timeout_s": 0.3})
    body = r.json()
    assert body["status"] == "timeout" and body["termination"]["reason"] == "wall_timeout"
    assert "0.3" in body["message"]  # the one table's message names the limit


def test_limit_results_read_the_same_whatever_the_backend(make) -> None:  # type: ignore[no-untyped-def]
    d = make(ScriptedBackend(script=fails(Reason.memory_limit)))
    body = d.invoke("python", {"code": "x"}).json()
    assert body["status"] == "killed" and body["termination"]["reason"] == "memory_limit"
    assert body["message"] and "memory" in body["message"]


def test_never_more_than_max_concurrency_at_once(make) -> None:  # type: ignore[no-untyped-def]
    backend = ScriptedBackend(script=sleeps(0.3))
    d = make(backend, max_concurrency=2)
    results: list[int] = []

    def call() -> None:
        results.append(d.invoke("python", {"code": "x"}).status_code)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 6 and len(backend.calls) == 6
    assert backend.peak == 2


def test_an_unavailable_backend_is_503_and_readiness_says_why(make) -> None:  # type: ignore[no-untyped-def]
    d = make(ScriptedBackend(), container=ScriptedBackend("container", available=False))
    r = d.invoke("shell", {"command": "ls"})
    assert r.status_code == 503 and "unavailable" in r.json()["detail"]
    ready = d.client.get("/readyz").json()
    assert ready["backends"]["container"]["available"] is False


def test_a_failed_self_test_refuses_to_start(tmp_path: Path) -> None:
    d = Daemon(tmp_path, ScriptedBackend(probe_ok=False))
    with pytest.raises(Exception, match="confinement self-test"), d.client:
        pass
    assert any(r["event"] == "startup_refused" for r in d.records())


def test_sessions_reach_the_backend_and_are_closed(make) -> None:  # type: ignore[no-untyped-def]
    d = make(ScriptedBackend(script=prints("")))
    session = d.client.post("/v1/sessions").json()["id"]
    assert d.invoke("python", {"code": "x"}, session=session).json()["session"] == session
    assert d.python.calls[0].session == session
    assert d.client.delete(f"/v1/sessions/{session}").status_code == 204
    assert session in d.python.closed_sessions
    assert verify(d.settings.audit_path).ok


@pytest.mark.parametrize(("tool", "arguments", "backend"), [
    ("shell", {"command": "ls -l"}, "container"),
    ("python", {"code": "import math"}, "restricted"),
    ("read_file", {"path": "./notes//a.txt"}, "workspace"),
])
def test_the_backend_receives_the_decisions_plan(make, monkeypatch, tool: str,  # type: ignore[no-untyped-def]
                                                 arguments: dict, backend: str) -> None:
    """The service passes the policy's plan on: the backend's invocation carries the very
    plan the decision made (the same command plan and limits objects, no field copied), with
    only the service's own display caps set."""
    d = make(ScriptedBackend(script=prints("")))
    decisions: list[Decision] = []
    decide = d.service.policy.decide

    def spy(*args: object) -> Decision:
        decisions.append(decide(*args))  # type: ignore[arg-type]
        return decisions[-1]

    monkeypatch.setattr(d.service.policy, "decide", spy)
    seen: list[Invocation] = []
    run = d.service.backends[backend].run

    async def recorded(invocation: Invocation, deadline: float) -> Result:
        seen.append(invocation)
        return await run(invocation, deadline)

    monkeypatch.setattr(d.service.backends[backend], "run", recorded)
    r = d.invoke(tool, arguments, limits={"timeout_s": 9})
    assert r.status_code == 200, r.text
    assert len(decisions) == 1 and len(seen) == 1, (decisions, r.json())
    (decision,), (call,) = decisions, seen
    assert decision.allowed and decision.plan is not None
    caps = DisplayCaps(d.settings.max_display_bytes, d.settings.max_displays)
    assert call.plan == replace(decision.plan, display=caps)
    assert call.plan.limits is decision.plan.limits and call.plan.limits.timeout_s == 9
    assert call.plan.command is decision.plan.command
    assert (call.tool, call.client, call.arguments) == (tool, "local", arguments)
    if tool == "read_file":  # the path the policy decided on, never the raw argument
        assert call.plan.path == "notes/a.txt"
