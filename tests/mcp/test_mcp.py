"""The MCP front door with the official SDK's client, through the ``sandboxd mcp`` stdio bridge (a
real subprocess) to a real daemon, and over Streamable HTTP to the daemon's app in process
(tests/support/inprocess.py; scripted calls print what the real ones would) where the test is of
the door alone. The real daemon stays where a sandbox's process matters (a timeout, a
cancellation that stops it), where a signal reloads the policy, and for the audit log of the
module's real calls."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import httpx
import psutil
import pytest
from mcp.shared.exceptions import MCPError

from sandboxd.audit import verify
from tests.mcp.conftest import McpDaemon, client_session, http_session
from tests.support.inprocess import InProcessDaemon, answers, by_code
from tests.support.processes import descendants, running
from tests.support.wait import async_wait_until, wait_until

TRANSPORTS = ["http", "stdio"]
INVALID_PARAMS = -32602


def text_of(result: Any) -> str:
    return "".join(c.text for c in result.content if c.type == "text")


#: what the real calls of this module print and return, for the daemon's app in process
SCRIPT = by_code({"print(6*7)": answers("42\n"),
                  "print(1)\n(3, 2)": answers("1\n", value=[3, 2])})


@pytest.fixture
def inproc_door(inproc_mcp_daemon: McpDaemon) -> McpDaemon:
    """The daemon's app in process, its calls answered as the real ones of this module."""
    assert isinstance(inproc_mcp_daemon.daemon, InProcessDaemon)
    inproc_mcp_daemon.daemon.python.script = SCRIPT
    return inproc_mcp_daemon


@pytest.fixture
def door(request: pytest.FixtureRequest, transport: str) -> McpDaemon:
    """Over HTTP the daemon's app in process (``inproc_door``); through the bridge, which is
    a process that dials a URL, the real daemon."""
    d: McpDaemon = request.getfixturevalue("mcp_daemon" if transport == "stdio"
                                           else "inproc_door")
    return d


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_tools_list_is_the_api_list(door: McpDaemon, transport: str) -> None:
    api = door.daemon.client.get("/v1/tools").json()
    async with client_session(transport, door) as session:
        assert session.initialize_result.capabilities.tools.list_changed is True
        listed = (await session.list_tools()).tools
    # the policy's tools, then the door's own (tests/mcp/test_fork_tool.py)
    assert [t.name for t in listed] == [t["name"] for t in api] + ["fork_session"]
    for tool, spec in zip(listed, api, strict=False):
        assert tool.description == spec["description"]
        assert tool.input_schema == spec["parameters"]
        assert tool.meta["sandboxd/available"] == spec["available"]
    # the one description tells the model that state persists within a session
    python = next(t for t in listed if t.name == "python")
    assert python.description and "persist between calls" in python.description


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_python_call_and_its_audit_record(door: McpDaemon, transport: str) -> None:
    async with client_session(transport, door) as session:
        result = await session.call_tool("python", {"code": "print(6*7)"})
    assert result.is_error is False
    assert text_of(result).strip() == "42"
    full = result.structured_content
    assert full["status"] == "ok" and full["stdout"] == "42\n" and full["tool"] == "python"
    assert full["session"].startswith("ses_")  # the MCP session's own workspace
    records = [r for r in door.records() if r.get("request_id") == full["id"]]
    assert [r["event"] for r in records] == ["decision", "result"]
    assert all(r["transport"] == "mcp" and r["client"] == "alice" for r in records)
    metrics = door.daemon.client.get("/metrics").text
    assert 'sandboxd_mcp_tool_calls_total{status="ok",tool="python"}' in metrics


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_denied_call_is_an_error_with_the_policy_message(door: McpDaemon,
                                                               transport: str) -> None:
    async with client_session(transport, door) as session:
        result = await session.call_tool("shell", {"command": "curl https://example.com"})
    assert result.is_error is True
    assert result.structured_content["status"] == "denied"
    assert result.structured_content["policy"]["rule"] == "tools.shell.commands.deny[0]"
    assert "`curl` is not allowed here; allowed commands: ls," in text_of(result)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_argument_errors_are_results_the_model_reads(door: McpDaemon,
                                                           transport: str) -> None:
    """2025-11-25 (what the SDK negotiates here), SEP-1303: arguments that fail the schema are
    an isError result naming the argument; an unknown tool and bad _meta stay -32602."""
    async with client_session(transport, door) as session:
        missing = await session.call_tool("python", {"cod": "print(1)"})
        wrong_type = await session.call_tool("python", {"code": 42})
        with pytest.raises(MCPError) as unknown:
            await session.call_tool("no_such_tool", {})
        with pytest.raises(MCPError) as bad_limit:
            await session.call_tool("python", {"code": "1"},
                                    meta={"sandboxd/limits": {"timeout_s": -1}})
    assert missing.is_error and wrong_type.is_error
    text = missing.content[0].text  # type: ignore[union-attr]
    assert "argument 'code': is required" in text and text.startswith("nothing ran"), text
    assert "not of type" in wrong_type.content[0].text  # type: ignore[union-attr]
    assert unknown.value.code == INVALID_PARAMS and "python" in unknown.value.data["available"]
    assert bad_limit.value.data["field"] == "_meta.sandboxd/limits.timeout_s"


def test_argument_errors_are_protocol_errors_before_2025_11_25(inproc_door: McpDaemon) -> None:
    """Earlier revisions said -32602 for invalid arguments: a session of 2025-06-18 gets it."""
    from tests.support.mcp_raw import RawMcp

    d = inproc_door
    mcp = RawMcp(d.daemon.url, {"authorization": f"Bearer {d.tokens['alice']}"},
                 protocol="2025-06-18", transport=d.sync_transport())
    try:
        answer = mcp.call("python", {"cod": "1"})
    finally:
        mcp.close()
    assert answer["error"]["code"] == INVALID_PARAMS, answer
    assert "argument 'code': is required" in answer["error"]["message"]
    assert answer["error"]["data"]["field"] == "code"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_timeout_is_an_error_with_the_reason(mcp_daemon: McpDaemon, transport: str) -> None:
    async with client_session(transport, mcp_daemon) as session:
        result = await session.call_tool("python", {"code": "while True:\n    pass"},
                                         meta={"sandboxd/limits": {"timeout_s": 2}})
    assert result.is_error is True
    full = result.structured_content
    assert full["status"] == "timeout", full
    assert full["termination"]["reason"] in ("wall_timeout", "cpu_limit")
    assert full["limits"]["timeout_s"] == 2 and full["cleanup"]["verified"] is True
    assert "status: timeout" in text_of(result)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_cancelled_call_stops_the_sandbox_process(mcp_daemon: McpDaemon,
                                                        transport: str) -> None:
    pid = mcp_daemon.daemon.proc.pid
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async with client_session(transport, mcp_daemon) as session:
        await session.call_tool("python", {"code": "x = 41"})  # warm: the zygote exists
        call = asyncio.create_task(session.call_tool(
            "python", {"code": "while True:\n    pass"}, progress_callback=on_progress,
            meta={"sandboxd/limits": {"timeout_s": 120}}))
        await async_wait_until(lambda: len(progress) >= 2 or call.done(), timeout=30,
                               interval=0.1, what="progress notifications while the call runs")
        assert len(progress) >= 2, "no progress notifications while the call ran"
        running_since = asyncio.get_running_loop().time()  # the call was in flight by then
        assert progress[-1][0] > progress[0][0] and "running for" in (progress[-1][1] or "")

        def busy_loop() -> list[psutil.Process]:
            assert not call.done(), "the call ended before its busy loop was seen"
            return [p for p in descendants(pid) if _cpu(p) > 0.3]

        busy = await async_wait_until(busy_loop, timeout=30, interval=0.2,
                                      what="the busy loop running in a sandbox process")
        call.cancel()  # the SDK sends notifications/cancelled
        at_least_ms = (asyncio.get_running_loop().time() - running_since) * 1000
        with pytest.raises(asyncio.CancelledError):
            await call
        # the cancel interrupted the code first: the session's kernel and its
        # variables are kept, and the session is still usable
        after = await session.call_tool("python", {"code": "print(x + 1)"})
        assert text_of(after).strip() == "42", text_of(after)
    # the very processes of the busy loop stop running it: ended, or the interrupted kernel
    # parked in its loop (counting the daemon's processes would not do: the zygote forks a
    # standby worker in place of each one a call takes, at its own moment)
    wait_until(lambda: not any(_spinning(p) for p in busy), timeout=15, interval=0.1,
               what="the busy loop to stop",
               detail=lambda: f"a busy loop outlived its call: {busy}")
    killed = wait_until(lambda: [r for r in mcp_daemon.records() if r["event"] == "result"
                                 and r.get("transport") == "mcp" and r["status"] == "killed"],
                        timeout=15, interval=0.1, what="the cancelled call's result record")
    assert killed[-1]["termination"]["reason"] == "cancelled"
    assert killed[-1]["cleanup"]["verified"] is True
    assert killed[-1]["kernel"]["interrupted"] is True, killed[-1]
    # audited with the time it ran until the cancel, not 0
    assert killed[-1]["resources"]["wall_ms"] >= at_least_ms > 0, killed[-1]["resources"]


def _spinning(proc: psutil.Process) -> bool:
    """Running on a CPU (or ready to): a process that has ended is not."""
    try:
        return running(proc) and proc.status() == psutil.STATUS_RUNNING
    except psutil.NoSuchProcess:
        return False


def _cpu(proc: psutil.Process) -> float:
    try:
        return proc.cpu_times().user
    except psutil.Error:
        return 0.0


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_session_keeps_files_and_sessions_are_isolated(door: McpDaemon,
                                                             transport: str) -> None:
    async with client_session(transport, door) as first:
        wrote = await first.call_tool("write_file", {"path": "notes.txt", "content": "kept"})
        assert wrote.is_error is False, text_of(wrote)
        again = await first.call_tool("read_file", {"path": "notes.txt"})
        assert text_of(again) == "kept"
        sid = again.structured_content["session"]
        workspace = wrote.structured_content["session"]
        assert sid == workspace
        async with client_session(transport, door) as second:
            other = await second.call_tool("read_file", {"path": "notes.txt"})
            assert other.is_error is True, text_of(other)
            assert other.structured_content["session"] != sid
        async with client_session(transport, door, name="bob") as bob:
            theirs = await bob.call_tool("list_files", {})
            assert "notes.txt" not in text_of(theirs)
    # the MCP session ended: its sandboxd session and workspace are gone
    deleted = wait_until(lambda: [r for r in door.records()
                                  if r["event"] == "session_deleted" and r["session"] == sid],
                         timeout=15, interval=0.1, what="its sandboxd session deleted")
    assert deleted[0]["transport"] == "mcp" and deleted[0]["client"] == "alice"
    assert not list(door.daemon.state_dir.rglob(f"*{sid}*"))


async def test_session_id_of_another_client_is_not_found(inproc_door: McpDaemon) -> None:
    sid = await _any_session_id(inproc_door)
    assert (await _post_with_session(inproc_door, "alice", sid)).status_code == 200
    assert (await _post_with_session(inproc_door, "bob", sid)).status_code == 404


async def _any_session_id(d: McpDaemon) -> str:
    async with httpx.AsyncClient(transport=d.transport()) as http:
        r = await http.post(d.url, headers=_headers(d.tokens["alice"]), json=_initialize())
        assert r.status_code == 200, r.text
        return r.headers["mcp-session-id"]


async def _post_with_session(d: McpDaemon, name: str, sid: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=d.transport()) as http:
        return await http.post(d.url, headers={**_headers(d.tokens[name]),
                                               "mcp-session-id": sid,
                                               "mcp-protocol-version": "2025-06-18"},
                               json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"})


def _headers(token: str | None) -> dict[str, str]:
    headers = {"accept": "application/json, text/event-stream",
               "content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    return headers


def _initialize() -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "0"}}}


async def test_unknown_token_is_401_and_audited(inproc_door: McpDaemon) -> None:
    mcp_daemon = inproc_door
    bad = "sbx_" + "B" * 43
    async with httpx.AsyncClient(transport=mcp_daemon.transport()) as http:
        for token in (None, bad):
            r = await http.post(mcp_daemon.url, headers=_headers(token), json=_initialize())
            assert r.status_code == 401, r.text
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.headers["www-authenticate"] == "Bearer"
    with pytest.raises(Exception):  # noqa: B017 - the SDK's own error for a refused initialize
        async with http_session(mcp_daemon.url, bad, transport=mcp_daemon.transport()):
            pass
    def audited() -> list[dict]:
        found = [r for r in mcp_daemon.records()
                 if r["event"] == "auth_failure" and "/mcp" in r["paths"]]
        # the failures of one interval are one record: wait until all three are written
        return found if sum(r["count"] for r in found) >= 3 else []

    wait_until(audited, timeout=30, interval=0.1,
               what="the three failed MCP authentications all audited")
    assert bad not in mcp_daemon.daemon.audit_path.read_text()


def test_bridge_with_a_bad_token_says_so(mcp_daemon: McpDaemon) -> None:
    import subprocess
    import sys

    token_file = mcp_daemon.tmp / "bad.token"
    token_file.write_text("sbx_" + "C" * 43)
    proc = subprocess.run(
        [sys.executable, "-m", "sandboxd", "mcp", "--url", mcp_daemon.daemon.url,
         "--token-file", str(token_file)],
        input=b"", capture_output=True, timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")})
    assert proc.returncode == 3, proc.stderr
    assert b"refused the token (HTTP 401)" in proc.stderr


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_tools_list_changed_after_a_policy_reload(mcp_daemon: McpDaemon,
                                                        transport: str) -> None:
    changed = asyncio.Event()

    async def on_message(message: Any) -> None:
        method = getattr(message, "method", None) or getattr(
            getattr(message, "root", None), "method", None)
        if method == "notifications/tools/list_changed":
            changed.set()

    policy = mcp_daemon.policies / "default.yaml"
    original = policy.read_text()
    async with client_session(transport, mcp_daemon, on_message=on_message) as session:
        before = {t.name for t in (await session.list_tools()).tools}
        assert "list_files" in before
        without = original.replace("  list_files:\n    paths:\n      allow: [\"**\"]\n", "")
        assert without != original
        policy.write_text(without)
        try:
            os.kill(mcp_daemon.daemon.proc.pid, signal.SIGHUP)
            await asyncio.wait_for(changed.wait(), 20)
            after = {t.name for t in (await session.list_tools()).tools}
        finally:
            policy.write_text(original)
            os.kill(mcp_daemon.daemon.proc.pid, signal.SIGHUP)
    assert after == before - {"list_files"}


def test_audit_log_has_the_mcp_calls_and_verifies(mcp_daemon: McpDaemon) -> None:
    records = mcp_daemon.records()
    mcp = [r for r in records if r.get("transport") == "mcp"]
    assert {r["event"] for r in mcp} >= {"decision", "result", "session_created",
                                         "session_deleted"}
    report = verify(mcp_daemon.daemon.audit_path)
    assert report.ok, report
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "sandboxd", "audit", "verify",
                           str(mcp_daemon.daemon.audit_path)], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


async def test_tools_have_titles_annotations_and_the_result_schema(
        inproc_door: McpDaemon) -> None:
    """What a host shows and checks before a model calls: a title, what the tool
    does to its sandbox (no network here: never open-world), admin-defined tools' from the
    policy, and an outputSchema that the structuredContent of a call validates against."""
    import jsonschema

    async with client_session("http", inproc_door) as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        result = await session.call_tool("python", {"code": "print(1)\n(3, 2)"})
    assert all(t.title and t.annotations and t.output_schema for t in tools.values()), tools
    ann = {name: t.annotations for name, t in tools.items()}
    assert ann["read_file"].read_only_hint is True and ann["list_files"].read_only_hint is True
    assert ann["python"].read_only_hint is False and ann["python"].destructive_hint is True
    assert ann["write_file"].idempotent_hint is True
    assert all(a is not None and a.open_world_hint is False for a in ann.values())
    assert tools["git_status"].title == "Git status"
    assert ann["git_status"].read_only_hint is True
    assert not result.is_error
    jsonschema.validate(result.structured_content, tools["python"].output_schema)
