"""The session's JavaScript/TypeScript kernel on the container backend, through a real daemon
and a real Docker engine: state across calls (let/const/functions/classes/modules, top-level
await, shared by javascript and typescript calls), the last expression's value and display(),
errors with their line, streamed output in order, the module rule (a denied module refused
before anything runs and audited; one named at run time refused by the kernel; files outside
the workspace refused), interrupt before kill, a loop that ignores the interrupt killed with
its kernel lost, limits, cleanup and isolation between sessions."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse

from tests.support.audit import audit_records

from .conftest import GRACE_S, Daemon

pytestmark = pytest.mark.timeout(300)


def test_state_persists_across_calls_and_languages(daemon: Daemon) -> None:
    sid = daemon.session()
    first = daemon.call("javascript", "const path = require('path')\n"
                                      "let x = await Promise.resolve(41)\n"
                                      "function twice(s) { return s + s }\n"
                                      "class Box { constructor(v) { this.v = v } }", sid)
    assert first["status"] == "ok", first
    assert first["kernel"] == {"fresh": True, "calls": 1, "lost": False, "reason": None,
                               "interrupted": False}, first
    res = daemon.call("javascript", "[x + 1, twice('ab'), new Box(3).v, path.join('a', 'b')]",
                      sid)
    assert res["status"] == "ok" and res["value"] == [42, "abab", 3, "a/b"], res
    assert res["kernel"]["fresh"] is False and res["kernel"]["calls"] == 2, res
    # declared again, as a notebook cell run twice; and typescript sees the same globals
    assert daemon.call("javascript", "let x = 5; x", sid)["value"] == 5
    ts = daemon.call("typescript", "interface P { n: number }\nconst p: P = {n: x * 2}\np",
                     sid)
    assert ts["status"] == "ok" and ts["value"] == {"n": 10}, ts
    daemon.close(sid)


@pytest.mark.parametrize(("code", "value"), [
    ("1 + 1", 2), ("'a' + 'b'", "ab"), ("[1, [2, null]]", [1, [2, None]]),
    ("({a: {b: true}})", {"a": {"b": True}}), ("new Map([[1, 2]])", "Map(1) { 1 => 2 }"),
    ("undefined", None), ("let q = 1", None), ("NaN", "NaN"),
    ("(() => 1)", "[Function (anonymous)]")])
def test_the_last_expression_is_the_value(daemon: Daemon, code: str, value: Any) -> None:
    res = daemon.call("javascript", code)  # one-shot: a fresh kernel of its own
    assert res["status"] == "ok", res
    assert res["value"] == value, res


def test_display_and_prints_keep_their_order(daemon: Daemon) -> None:
    res = daemon.call("javascript", "console.log('before')\n"
                                    "display({'text/html': '<b>hi</b>'}, {raw: true})\n"
                                    "display([1, 2])\nconsole.log('after')\n7")
    assert res["status"] == "ok" and res["value"] == 7, res
    assert res["stdout"] == "before\nafter\n", res
    datas = [o["data"] for o in res["outputs"]]
    assert datas[0]["text/html"] == "<b>hi</b>", res["outputs"]
    assert datas[1]["application/json"] == [1, 2], res["outputs"]


def test_an_error_names_its_line(daemon: Daemon) -> None:
    res = daemon.call("javascript", "let a = 1\nlet b = 2\nnull.boom\nlet c = 3")
    assert res["status"] == "error", res
    assert res["message"].startswith("TypeError: Cannot read properties of null"), res
    assert res["stderr"].startswith("<code>:3:6\nnull.boom\n"), res
    syntax = daemon.call("javascript", "let ok = 1\nlet z = 1 +")
    assert syntax["status"] == "error" and "SyntaxError" in syntax["message"], syntax
    assert syntax["stderr"].startswith("<code>:2:"), syntax
    ts = daemon.call("typescript", "let n: number = 'text'")  # types are not checked
    assert ts["status"] == "ok", ts
    # the transpiler drops the interface and the type: the line named is still the caller's
    typed = daemon.call("typescript", "interface P {\n  n: number\n}\ntype Q = string\n"
                                      "const p: P = {n: 1}\nnull.boom")
    assert typed["status"] == "error", typed
    assert typed["stderr"].startswith("<code>:6:6\nnull.boom\n"), typed
    assert "<code>:6:6" in typed["stderr"].split("\n\n", 1)[1], typed  # the frames too


def test_output_is_streamed_in_order(daemon: Daemon) -> None:
    sid = daemon.session()
    code = ("for (const i of [1, 2, 3]) { console.log('out' + i); console.error('err' + i);"
            " await new Promise((r) => setTimeout(r, 200)) }")
    with httpx.Client(base_url=daemon.d.url, headers=daemon.d.headers, timeout=120) as c, \
            connect_sse(c, "POST", "/v1/tools/javascript/invoke",
                        json={"arguments": {"code": code}, "session": sid},
                        headers={"Accept": "text/event-stream"}) as src:
        assert src.response.status_code == 200, src.response.read()
        events = [(sse.event, json.loads(sse.data)) for sse in src.iter_sse()]
    assert events[-1][0] == "result" and events[-1][1]["status"] == "ok", events
    parts = [(kind, data["text"]) for kind, data in events if kind in ("stdout", "stderr")]
    assert parts == [(k, f"{w}{i}\n") for i in (1, 2, 3)
                     for k, w in (("stdout", "out"), ("stderr", "err"))], parts
    daemon.close(sid)


@pytest.mark.parametrize(("code", "rule"), [
    ("const cp = require('child_process')", "tools.javascript.modules"),
    ("import http from 'node:http'", "tools.javascript.modules"),
    ("x = 1\nawait import('worker_threads')", "tools.javascript.modules"),
    ("require('os').userInfo()", "tools.javascript.modules.deny[0]")])
def test_a_denied_module_is_refused_with_its_rule_and_audited(daemon: Daemon, code: str,
                                                              rule: str) -> None:
    sid = daemon.session()
    res = daemon.call("javascript", code, sid)
    assert res["status"] == "denied", res
    assert res["policy"]["rule"] == rule, res
    assert f"line {code.count(chr(10)) + 1}, column" in res["message"], res
    assert res["kernel"] is None  # nothing reached a kernel
    decisions = [r for r in audit_records(daemon.d.audit_path, "decision")
                 if r.get("request_id") == res["id"]]
    assert [d["decision"] for d in decisions] == ["deny"], decisions
    daemon.close(sid)


def test_the_kernel_checks_what_is_named_at_run_time(daemon: Daemon) -> None:
    sid = daemon.session()
    res = daemon.call("javascript", "const name = ['child', 'process'].join('_')\n"
                                    "require(name)", sid)
    assert res["status"] == "error", res
    assert res["message"].startswith("ModuleNotAllowed: module 'child_process' is not allowed"), res
    files = daemon.call("javascript", "const fs = require('fs')\n"
                                      "fs.writeFileSync('mine.txt', 'ok')\n"
                                      "fs.readFileSync('/etc/passwd')", sid)
    assert files["status"] == "error", files
    assert "'/etc/passwd' is outside the workspace" in files["message"], files
    kept = daemon.call("javascript", "fs.readFileSync('mine.txt', 'utf8')", sid)
    assert kept["value"] == "ok", kept
    # the process object's ways around the module rule are closed too
    binding = daemon.call("javascript", "process.binding('spawn_sync')", sid)
    assert binding["status"] == "error" and "not allowed" in binding["message"], binding
    daemon.close(sid)


@pytest.mark.parametrize("code", ["while (true) {}",
                                  "console.log('before'); await new Promise(() => {})"])
def test_a_runaway_call_is_interrupted_and_the_state_kept(daemon: Daemon, code: str) -> None:
    sid = daemon.session()
    assert daemon.call("javascript", "let kept = 41", sid)["status"] == "ok"
    res = daemon.call("javascript", code, sid, timeout_s=2)
    assert res["status"] == "timeout", res
    assert res["termination"]["reason"] == "wall_timeout", res
    assert res["kernel"]["interrupted"] is True and res["kernel"]["lost"] is False, res
    assert res["cleanup"]["verified"] is True, res
    after = daemon.call("javascript", "kept + 1", sid)
    assert after["value"] == 42, after
    assert after["kernel"]["fresh"] is False and after["kernel"]["calls"] == 3, after
    daemon.close(sid)


def test_a_loop_that_ignores_the_interrupt_is_killed(daemon: Daemon) -> None:
    sid = daemon.session()
    assert daemon.call("javascript", "let x = 1", sid)["status"] == "ok"
    # after an await, a busy loop runs where neither node's SIGINT watchdog nor a listener can
    res = daemon.call("javascript", "await null; while (true) {}", sid, timeout_s=1)
    assert res["status"] == "timeout", res
    assert res["kernel"]["lost"] is True and res["kernel"]["interrupted"] is False, res
    assert res["kernel"]["reason"] == "wall_timeout", res
    assert f"did not come back from the interrupt within {GRACE_S} s" in res["message"], res
    assert res["cleanup"]["verified"] is True, res
    fresh = daemon.call("javascript", "typeof x", sid)
    assert fresh["value"] == "undefined" and fresh["kernel"]["fresh"] is True, fresh
    daemon.close(sid)


def test_limits_end_the_kernel_truthfully(daemon: Daemon) -> None:
    sid = daemon.session()
    assert daemon.call("javascript", "let x = 1", sid)["status"] == "ok"
    memory = daemon.call("javascript", "const chunks = []\n"
                                       "while (true) chunks.push(Buffer.alloc(2 ** 20, 1))",
                         sid, limits={"memory_bytes": 128 * 2**20})
    assert memory["termination"]["reason"] == "memory_limit", memory
    assert memory["kernel"]["lost"] is True, memory
    assert memory["cleanup"]["verified"] is True, memory
    # typescript's tool allows worker_threads (the test policy): each worker is a thread
    pids = daemon.call("typescript", "const { Worker } = require('worker_threads')\n"
                                     "for (let i = 0; i < 40; i++) new Worker("
                                     "'setInterval(() => {}, 1000)', {eval: true})\n"
                                     "await new Promise((r) => setTimeout(r, 5000))",
                       sid, limits={"pids": 16})
    assert pids["termination"]["reason"] == "pids_limit", pids
    assert pids["kernel"]["lost"] is True, pids
    assert pids["cleanup"]["verified"] is True, pids
    after = daemon.call("javascript", "typeof x", sid)
    assert after["value"] == "undefined" and after["kernel"]["fresh"] is True, after
    daemon.close(sid)


def test_a_thread_left_running_ends_the_kernel(daemon: Daemon) -> None:
    sid = daemon.session()
    res = daemon.call("typescript", "const { Worker } = require('worker_threads')\n"
                                    "new Worker('while (true) {}', {eval: true})\n"
                                    "await new Promise((r) => setTimeout(r, 300))", sid)
    assert res["kernel"]["lost"] is True, res
    assert "threads" in res["message"], res
    daemon.close(sid)


def test_timers_end_with_their_call_and_cleanup_is_verified(daemon: Daemon) -> None:
    sid = daemon.session()
    res = daemon.call("javascript", "setInterval(() => console.log('tick'), 10); 'started'", sid)
    assert res["status"] == "ok" and res["cleanup"]["verified"] is True, res
    later = daemon.call("javascript", "await new Promise((r) => setTimeout(r, 200)); 'quiet'",
                        sid)
    assert later["value"] == "quiet" and later["stdout"] == "", later
    daemon.close(sid)


def test_sessions_are_isolated(daemon: Daemon) -> None:
    one, two = daemon.session(), daemon.session()
    assert daemon.call("javascript", "globalThis.secret = 'one'", one)["status"] == "ok"
    res = daemon.call("javascript", "typeof secret", two)
    assert res["value"] == "undefined", res
    assert daemon.call("javascript", "secret", one)["value"] == "one"
    daemon.close(one)
    daemon.close(two)


def test_a_sessions_python_and_javascript_kernels_share_the_workspace(daemon: Daemon) -> None:
    sid = daemon.session()
    assert daemon.call("python", "open('from_py.txt', 'w').write('py')", sid)["status"] == "ok"
    res = daemon.call("javascript", "const fs = require('fs')\n"
                                    "fs.writeFileSync('from_js.txt', 'js')\n"
                                    "fs.readFileSync('from_py.txt', 'utf8')", sid)
    assert res["value"] == "py", res
    back = daemon.call("python", "open('from_js.txt').read()", sid)
    assert back["value"] == "js", back
    daemon.close(sid)
