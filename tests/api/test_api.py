"""The HTTP API: what only the real backend answers through a real uvicorn server on a real
socket (a daemon subprocess); the HTTP surface itself (errors, validation, policy, queueing,
metrics) on the daemon's app in process (tests/support/inprocess.py, ``inproc``)."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from sandboxd.backends.scripted import sleeps
from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon
from tests.support.inprocess import InProcessDaemon, inprocess_daemon
from tests.support.processes import busy_descendants
from tests.support.wait import wait_until

PROBLEM = "application/problem+json"


@pytest.fixture
def daemon(module_daemon: RunningDaemon) -> RunningDaemon:
    """This module's tests share one daemon (tests/conftest.py: module_daemon)."""
    return module_daemon


def assert_problem(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body = response.json()
    assert body["status"] == status
    assert body["type"].startswith("https://")
    assert body["title"] and body["detail"]
    return body


def test_health_and_readiness(daemon: RunningDaemon) -> None:
    assert daemon.client.get("/healthz").json()["status"] == "ok"
    ready = daemon.client.get("/readyz")
    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["ready"] is True
    restricted = body["backends"]["restricted"]
    assert restricted["ok"] is True
    assert {c["name"] for c in restricted["checks"]}  # the probes that ran are named


def test_list_tools_and_openai_format(inproc: InProcessDaemon) -> None:
    tools = inproc.client.get("/v1/tools").json()
    by_name = {t["name"]: t for t in tools}
    assert {"python", "read_file", "write_file", "list_files"} <= set(by_name)
    python = by_name["python"]
    assert python["backend"] == "restricted"
    assert python["available"] is True
    assert python["parameters"]["required"] == ["code"]
    openai = inproc.client.get("/v1/tools", params={"format": "openai"}).json()
    assert openai, "no tools in OpenAI format"
    for entry in openai:
        assert set(entry) == {"type", "function"}
        assert entry["type"] == "function"
        assert set(entry["function"]) == {"name", "description", "parameters"}
        assert entry["function"]["parameters"]["type"] == "object"
    names = [e["function"]["name"] for e in openai]
    assert "python" in names
    # only tools that can run right now are handed to a model
    assert set(names) == {t["name"] for t in tools if t["available"]}


def test_invoke_python_ok(daemon: RunningDaemon) -> None:
    r = daemon.invoke("python", {"code": "print(6*7)\n6*7"})
    assert r.status_code == 200, r.text
    result = r.json()
    assert result["status"] == "ok"
    assert result["stdout"] == "42\n"
    assert result["value"] == 42
    assert result["termination"] == {"reason": "exited", "exit_code": 0, "signal": None}
    assert result["policy"]["decision"] == "allow"
    assert result["policy"]["source"].endswith("default.yaml")
    assert result["policy"]["rule"].startswith("tools.python")
    assert result["cleanup"]["verified"] is True
    assert result["id"].startswith("inv_")
    for key in ("timeout_s", "memory_bytes", "cpus", "pids", "output_bytes", "network"):
        assert key in result["limits"]


def test_schema_errors_are_422_naming_the_field(inproc: InProcessDaemon) -> None:
    body = assert_problem(inproc.invoke("python", {"code": 5}), 422)
    assert body["field"] == "code"
    body = assert_problem(inproc.invoke("python", {}), 422)
    assert body["field"] == "code"
    assert "required" in body["detail"]
    body = assert_problem(inproc.invoke("python", {"code": "1", "evil": True}), 422)
    assert body["field"] == "evil"
    # a malformed envelope (limits of the wrong type) names its field too
    r = inproc.client.post("/v1/tools/python/invoke",
                           json={"arguments": {"code": "1"}, "limits": {"timeout_s": -1}})
    body = assert_problem(r, 422)
    assert body["field"] == "limits.timeout_s"


def test_other_errors_are_problem_json(tmp_path: Path) -> None:
    with inprocess_daemon(tmp_path, env={"SANDBOXD_MAX_BODY_BYTES": "2000"}) as d:
        body = assert_problem(d.invoke("no_such_tool", {}), 404)
        assert "python" in body["available_tools"]
        assert "no_such_tool" in body["detail"]
        r = d.client.post("/v1/tools/python/invoke", content=b"{not json",
                          headers={"content-type": "application/json"})
        assert_problem(r, 400)
        r = d.invoke("python", {"code": "x = 1\n" * 1000})
        body = assert_problem(r, 413)
        assert "2000" in body["detail"]
        assert_problem(d.client.get("/v1/nothing-here"), 404)
        assert_problem(d.client.get("/v1/sessions/ses_doesnotexist"), 404)


def test_limits_can_only_be_lowered(inproc: InProcessDaemon) -> None:
    r = inproc.invoke("python", {"code": "1"}, limits={"timeout_s": 10_000, "memory_bytes": 2**40})
    limits = r.json()["limits"]
    assert limits["timeout_s"] < 10_000
    assert limits["memory_bytes"] < 2**40
    r = inproc.invoke("python", {"code": "1"}, limits={"timeout_s": 2.5})
    assert r.json()["limits"]["timeout_s"] == 2.5


def test_denied_call_is_200_with_actionable_message(inproc: InProcessDaemon) -> None:
    r = inproc.invoke("python", {"code": "import os\nos.getcwd()"})
    assert r.status_code == 200
    result = r.json()
    assert result["status"] == "denied"
    assert result["termination"]["reason"] == "policy"
    assert "os" in result["message"]
    assert result["policy"]["decision"] == "deny"
    explained = inproc.client.post("/v1/policy/explain",
                                   json={"tool": "python", "arguments": {"code": "import os"}})
    assert explained.status_code == 200
    assert explained.json()["allowed"] is False
    assert explained.json()["rule"] == result["policy"]["rule"]
    # the rule's place in the policy file, as file:line:column
    source, line, column = explained.json()["location"].rsplit(":", 2)
    assert source.endswith("default.yaml") and int(line) > 1 and int(column) >= 1


def test_sessions_keep_files_and_one_shot_calls_do_not(daemon: RunningDaemon) -> None:
    created = daemon.client.post("/v1/sessions", json={"ttl_s": 120})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    w = daemon.invoke("write_file", {"path": "notes/a.txt", "content": "hello"}, session=sid)
    assert w.json()["status"] == "ok", w.text
    r = daemon.invoke("read_file", {"path": "notes/a.txt"}, session=sid).json()
    assert (r["status"], r["stdout"]) == ("ok", "hello")
    # python in the same session sees the file through its confined open()
    p = daemon.invoke("python", {"code": "print(open('notes/a.txt').read())"}, session=sid).json()
    assert (p["status"], p["stdout"]) == ("ok", "hello\n"), p
    listing = daemon.invoke("list_files", {"path": "notes"}, session=sid).json()
    assert [e["name"] for e in listing["value"]] == ["a.txt"]
    info = daemon.client.get(f"/v1/sessions/{sid}").json()
    assert info["workspace_bytes"] > 0
    # without a session every call starts from an empty workspace
    daemon.invoke("write_file", {"path": "x.txt", "content": "1"})
    gone = daemon.invoke("read_file", {"path": "x.txt"}).json()
    assert gone["status"] == "error" and "does not exist" in gone["message"]
    # escaping paths are refused
    esc = daemon.invoke("read_file", {"path": "../../etc/passwd"}, session=sid).json()
    assert esc["status"] in ("rejected", "denied")
    assert daemon.client.delete(f"/v1/sessions/{sid}").status_code == 204
    assert daemon.client.get(f"/v1/sessions/{sid}").status_code == 404
    assert not any((daemon.state_dir / "workspaces").glob(f"{sid}*"))


def test_sessions_are_isolated_between_clients(tmp_path: Path) -> None:
    from sandboxd.access.tokens import add_token

    tokens = tmp_path / "tokens.yaml"
    alice = add_token(tokens, "alice")
    bob = add_token(tokens, "bob")
    with inprocess_daemon(tmp_path, env={"SANDBOXD_TOKENS_FILE": str(tokens)}) as d:
        a = d.http(alice)
        b = d.http(bob)
        sid = a.post("/v1/sessions").json()["id"]
        body = {"arguments": {"path": "secret.txt", "content": "alice's"}, "session": sid}
        assert a.post("/v1/tools/write_file/invoke", json=body).json()["status"] == "ok"
        # bob can neither see, use nor delete alice's session
        assert_problem(b.get(f"/v1/sessions/{sid}"), 404)
        read = {"arguments": {"path": "secret.txt"}, "session": sid}
        assert_problem(b.post("/v1/tools/read_file/invoke", json=read), 404)
        assert_problem(b.delete(f"/v1/sessions/{sid}"), 404)
        assert a.post("/v1/tools/read_file/invoke", json=read).json()["stdout"] == "alice's"
        assert_problem(d.http().get("/v1/tools"), 401)
        a.close()
        b.close()


SLOW = """
import datetime
start = datetime.datetime.now().timestamp()
n = 0
while datetime.datetime.now().timestamp() - start < {seconds}:
    n += 1
print(start, datetime.datetime.now().timestamp())
"""


def test_concurrency_cap_with_eight_slow_calls(daemon: RunningDaemon) -> None:
    def call(_: int) -> dict:
        return daemon.invoke("python", {"code": SLOW.format(seconds=1.0)},
                             limits={"timeout_s": 60}).json()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(8)))
    spans = []
    for r in results:
        assert r["status"] == "ok", r
        start, end = map(float, r["stdout"].split())
        spans.append((start, end))
    # the workers' own timestamps: how many ran at each start instant
    overlap = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert overlap <= 4, spans
    assert overlap >= 2, "calls did not run in parallel at all"
    assert max(e for _, e in spans) - min(s for s, _ in spans) >= 1.9  # two waves at least


def test_queue_full_gives_429_with_retry_after(tmp_path: Path) -> None:
    env = {"SANDBOXD_MAX_CONCURRENCY": "1", "SANDBOXD_QUEUE_SIZE": "1"}
    with inprocess_daemon(tmp_path, env=env, script=sleeps(1.5)) as d:
        def call(_: int) -> httpx.Response:
            return d.invoke("python", {"code": SLOW.format(seconds=1.5)})

        with ThreadPoolExecutor(4) as pool:
            responses = list(pool.map(call, range(4)))
        codes = sorted(r.status_code for r in responses)
        assert codes.count(200) == 2, codes  # one running + one queued
        refused = [r for r in responses if r.status_code == 429]
        assert len(refused) == 2
        for r in refused:
            assert int(r.headers["retry-after"]) >= 1
            assert_problem(r, 429)
        metrics = d.client.get("/metrics").text
        assert "sandboxd_rejections_total" in metrics


def test_timeout_comes_back_as_timeout(daemon: RunningDaemon) -> None:
    r = daemon.invoke("python", {"code": "while True:\n    pass"}, limits={"timeout_s": 1})
    result = r.json()
    assert result["status"] == "timeout", result
    assert result["termination"]["reason"] in ("wall_timeout", "cpu_limit")
    assert result["cleanup"]["verified"] is True
    assert result["resources"]["wall_ms"] < 10_000


def test_disconnected_client_cancels_and_cleans_up(daemon: RunningDaemon) -> None:
    daemon.invoke("python", {"code": "1"})  # warm up: the zygote exists now
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{daemon.url}/v1/tools/python/invoke",
                   json={"arguments": {"code": "while True:\n    pass"},
                         "limits": {"timeout_s": 60}}, timeout=1.0)
    # the busy loop ends with its call (counting processes would not do: the zygote forks
    # a standby worker in place of each one a call takes, at a moment of its own)
    wait_until(lambda: not busy_descendants(daemon.proc.pid), timeout=15, interval=0,
               what="the busy loop of the cancelled call to end",
               detail=lambda: f"busy: {busy_descendants(daemon.proc.pid)}")
    # the audit log says the call was cancelled
    cancelled = wait_until(
        lambda: [r for r in audit_records(daemon.audit_path)
                 if r.get("event") == "result" and r.get("status") == "killed"],
        timeout=5, interval=0.1, what="an audit record for the cancelled call")
    assert cancelled[-1]["termination"]["reason"] == "cancelled"
    # the backend's proof that the worker is gone reaches the audit record
    assert cancelled[-1]["cleanup"]["verified"] is True, cancelled[-1]


def _ok_python_calls(daemon: RunningDaemon | InProcessDaemon) -> float:
    text = daemon.client.get("/metrics").text
    found = re.search(r'^sandboxd_invocations_total\{status="ok",tool="python"\} (\S+)$', text,
                      re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_metrics_count_invocations(inproc: InProcessDaemon) -> None:
    before = _ok_python_calls(inproc)
    inproc.invoke("python", {"code": "print(1)"})
    assert _ok_python_calls(inproc) == before + 1
    text = inproc.client.get("/metrics").text
    assert "sandboxd_queue_depth 0.0" in text
    assert "sandboxd_slots_in_use" in text


def test_display_items_come_back_in_the_result(daemon: RunningDaemon) -> None:
    r = daemon.invoke("python", {"code": "display([1, 2])\nprint('x')\ndisplay('done')"})
    assert r.status_code == 200, r.text
    result = r.json()
    assert result["status"] == "ok" and result["stdout"] == "x\n"
    assert result["outputs"] == [
        {"type": "display", "data": {"text/plain": "[1, 2]", "application/json": [1, 2]},
         "truncated": False, "at": {"stdout": 0, "stderr": 0}},
        {"type": "display", "data": {"text/plain": "'done'", "application/json": "done"},
         "truncated": False, "at": {"stdout": 2, "stderr": 0}},
    ]
    records = audit_records(daemon.audit_path)
    mine = [rec for rec in records if rec.get("invocation") == result["id"]
            and rec.get("event") == "result"]
    assert mine and mine[-1]["displays"] == 2  # counted, content not logged
    assert "done" not in json.dumps(mine[-1])


def test_request_errors_say_where_and_what_to_send_instead(inproc: InProcessDaemon) -> None:
    """Bad JSON names its line and column; a body that is no JSON object names the body
    expected and the Content-Type it came with; the 413 names its setting and the route that
    takes big files (they used to say only "Expecting ',' delimiter",
    "'(body)': Input should be a valid dictionary", a bare 413)."""
    url = "/v1/tools/python/invoke"
    bad = inproc.client.post(url, content=b'{"arguments":\n  {"code" "1"}}',
                             headers={"content-type": "application/json"})
    assert bad.status_code == 400, bad.text
    assert bad.json()["detail"].endswith("at line 2, column 11"), bad.json()
    text = inproc.client.post(url, content=b"print(1)", headers={"content-type": "text/plain"})
    assert text.status_code == 422, text.text
    assert "must be a JSON object sent as application/json" in text.json()["detail"]
    assert "text/plain" in text.json()["detail"]
    huge = inproc.client.post(url, content=b" " * 2**21,
                              headers={"content-type": "application/json"})
    assert huge.status_code == 413, huge.text
    detail = huge.json()["detail"]
    assert "max_body_bytes" in detail and "PUT /v1/sessions/{id}/files/{path}" in detail, detail
