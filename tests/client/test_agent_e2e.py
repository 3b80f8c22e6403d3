"""End to end: the Agent, a scripted LLM over real SSE, and a real running sandboxd."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from typing import Any

import psutil
import pytest

from sandboxd_client import Agent, AsyncSandboxClient, SandboxClient
from tests.client.conftest import TokenDaemon
from tests.client.scripted_llm import (
    Reply,
    ScriptedLLM,
    last_tool_results,
    text_reply,
    tool_call_reply,
)
from tests.support.audit import audit_records
from tests.support.processes import busy_descendants
from tests.support.wait import async_wait_until, wait_until


def multiply_script(body: dict[str, Any], n: int) -> Reply:
    """A model that computes with the python tool and answers with the number it got back."""
    results = last_tool_results(body)
    if results:
        numbers = re.findall(r"-?\d{5,}", results[0]["content"])
        if not numbers:
            return text_reply(f"The tool did not give me a number: {results[0]['content']}")
        return text_reply(f"12345 * 54321 = {numbers[0]}")
    offered = [t["function"]["name"] for t in body.get("tools", [])]
    if "python" not in offered:
        return text_reply(f"no python tool offered (got {offered})")
    return tool_call_reply([("python", {"code": "print(12345 * 54321)"})], split=5)


def test_agent_answers_multiplication_with_sandbox_python(token_daemon: TokenDaemon) -> None:
    with ScriptedLLM(multiply_script) as llm, \
            SandboxClient(token_daemon.url, token=token_daemon.token) as sandbox:
        result = Agent(llm.url, "qwen2.5-7b-instruct", sandbox=sandbox).act(
            "What is 12345 * 54321?", tools=["python"])
    assert llm.rejections == []
    assert result.text == f"12345 * 54321 = {12345 * 54321}"
    (record,) = result.tool_calls
    assert record.ok and record.result is not None
    assert record.result.status == "ok" and record.result.tool == "python"
    assert record.result.stdout.strip() == str(12345 * 54321)
    # the model received the real sandbox output
    assert str(12345 * 54321) in llm.requests[1]["messages"][-1]["content"]


def test_agent_with_session_workspace_tools(token_daemon: TokenDaemon) -> None:
    """Files written by one call are there for the next call of the same session."""

    def script(body: dict[str, Any], n: int) -> Reply:
        if n == 0:
            return tool_call_reply([("write_file", {"path": "notes.txt", "content": "42 apples"})])
        if n == 1:
            return tool_call_reply([("read_file", {"path": "notes.txt"})], ids=["call_r"])
        return text_reply("The file says: " + last_tool_results(body)[0]["content"])

    with ScriptedLLM(script) as llm, \
            SandboxClient(token_daemon.url, token=token_daemon.token) as sandbox, \
            sandbox.session() as session:
        agent = Agent(llm.url, "m", sandbox=sandbox, session=session.id)
        result = agent.act("remember 42 apples")
        assert session.read_file("notes.txt") == "42 apples"
    assert result.text == "The file says: 42 apples"
    # tools=None offered every available sandboxd tool, as the daemon lists them
    offered = {t["function"]["name"] for t in llm.requests[0]["tools"]}
    assert {"read_file", "write_file", "list_files"} <= offered


def test_policy_denial_reaches_the_model(token_daemon: TokenDaemon) -> None:
    def script(body: dict[str, Any], n: int) -> Reply:
        if n == 0:
            return tool_call_reply([("shell", {"command": "curl http://example.com"})])
        return text_reply(last_tool_results(body)[0]["content"])

    with ScriptedLLM(script) as llm, \
            SandboxClient(token_daemon.url, token=token_daemon.token) as sandbox:
        # the shell tool may be unavailable on this host; offer it via a local stand-in schema
        agent = Agent(llm.url, "m", sandbox=sandbox)
        schemas = {t.name: t for t in sandbox.tools()}
        agent._sandbox_schemas = {"shell": schemas["shell"].openai()}
        result = agent.act("fetch example.com", tools=["shell"])
    (record,) = result.tool_calls
    assert record.error is not None and record.error.kind == "denied"
    assert result.text.startswith("Denied by policy: `curl` is not allowed")
    assert "tools.shell.commands.deny" in result.text
    assert "do not repeat it" in result.text


async def test_cancelling_act_cancels_the_sandbox_call(
        own_token_daemon: TokenDaemon) -> None:
    def script(body: dict[str, Any], n: int) -> Reply:
        return tool_call_reply([("python", {"code": "while True:\n    pass"})])

    with ScriptedLLM(script) as llm:
        async with AsyncSandboxClient(own_token_daemon.url,
                                      token=own_token_daemon.token) as sandbox:
            started = asyncio.Event()
            agent = Agent(llm.url, "m", sandbox=sandbox)
            task = asyncio.create_task(agent.aact(
                "spin", tools=["python"], tool_timeout_s=120,
                on_message=lambda m: started.set() if m.get("tool_calls") else None))
            await asyncio.wait_for(started.wait(), 30)
            pid = own_token_daemon.daemon.proc.pid
            await async_wait_until(lambda: asyncio.to_thread(busy_descendants, pid), timeout=60,
                                   interval=0, what="the call's busy loop running in the sandbox")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    # the daemon saw the request go away and cancelled the execution, cleaning up
    audit = own_token_daemon.daemon.audit_path
    records = wait_until(lambda: [r for r in audit_records(audit, "result")
                                  if r.get("tool") == "python"],
                         timeout=30, interval=0.2, what="a result audited for the cancelled call")
    record = records[-1]
    assert record["termination"]["reason"] == "cancelled"
    assert record["status"] == "killed"
    # nothing of the call is left spinning: the daemon's process tree burns no CPU any more
    daemon = psutil.Process(own_token_daemon.daemon.proc.pid)

    def tree_cpu() -> float:
        total = 0.0
        for p in [daemon, *daemon.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    before = tree_cpu()
    time.sleep(1.5)  # sleep-ok: the CPU window in which nothing may spin any more
    assert tree_cpu() - before < 0.75, "a busy loop is still running after the cancel"


def test_sandbox_timeout_is_phrased_for_the_model(token_daemon: TokenDaemon) -> None:
    def script(body: dict[str, Any], n: int) -> Reply:
        if n == 0:
            return tool_call_reply([("python", {"code": "while True:\n    pass"})])
        return text_reply(last_tool_results(body)[0]["content"])

    with ScriptedLLM(script) as llm, \
            SandboxClient(token_daemon.url, token=token_daemon.token) as sandbox:
        result = Agent(llm.url, "m", sandbox=sandbox).act("spin", tools=["python"],
                                                          tool_timeout_s=1)
    (record,) = result.tool_calls
    assert record.result is not None and record.result.status == "timeout"
    assert record.error is not None and record.error.kind == "timeout"
    assert result.text.startswith("Error: `python` timed out after 1 s and was stopped")


def test_act_opens_a_session_for_the_run_and_closes_it(token_daemon: TokenDaemon) -> None:
    """Without a session given, one run's calls share a workspace (and kernel), and the
    session is deleted when the run ends; a session passed in stays open."""

    def script(body: dict[str, Any], n: int) -> Reply:
        if n % 3 == 0:
            return tool_call_reply([("write_file", {"path": "n.txt", "content": "7 pears"})])
        if n % 3 == 1:
            return tool_call_reply([("read_file", {"path": "n.txt"})], ids=["call_r"])
        return text_reply("read: " + last_tool_results(body)[0]["content"])

    with ScriptedLLM(script) as llm, \
            SandboxClient(token_daemon.url, token=token_daemon.token) as sandbox:
        before = {s.id for s in sandbox.sessions()}
        result = Agent(llm.url, "m", sandbox=sandbox).act("remember")
        assert result.text == "read: 7 pears"
        used = {r.result.session for r in result.tool_calls if r.result is not None}
        assert len(used) == 1 and None not in used
        assert {s.id for s in sandbox.sessions()} == before  # closed at the end
        with sandbox.session() as mine:
            Agent(llm.url, "m", sandbox=sandbox).act("remember", session=mine.id)
            assert mine.id in {s.id for s in sandbox.sessions()}
            assert mine.read_file("n.txt") == "7 pears"
        # opted out: every call gets a fresh workspace, so the read fails
        result = Agent(llm.url, "m", sandbox=sandbox, auto_session=False).act("remember")
        assert {r.result.session for r in result.tool_calls if r.result is not None} == {None}
        assert "7 pears" not in result.text


def test_the_model_reads_display_items(token_daemon: TokenDaemon) -> None:
    """``display()`` items come back on the record's result, and the model reads their text."""

    def script(body: dict[str, Any], n: int) -> Reply:
        results = last_tool_results(body)
        if results:
            return text_reply("saw: " + results[0]["content"])
        return tool_call_reply([("python", {"code": "print('rows: 3')\n"
                                                    "display({'total': 42})"})])

    with ScriptedLLM(script) as llm, \
            SandboxClient(token_daemon.url, token=token_daemon.token) as sandbox:
        result = Agent(llm.url, "qwen2.5-7b-instruct", sandbox=sandbox).act(
            "Sum the rows", tools=["python"])
    (record,) = result.tool_calls
    assert record.result is not None and record.result.status == "ok"
    assert [o.data for o in record.result.outputs] == [
        {"text/plain": "{'total': 42}", "application/json": {"total": 42}}]
    assert record.result.images() == []
    assert result.text == "saw: stdout:\nrows: 3\ndisplay:\n{'total': 42}"


def test_invoke_stream_yields_output_before_the_result(token_daemon: TokenDaemon) -> None:
    from sandboxd_client import ToolOutput

    code = "import time\nprint('a', flush=True)\ntime.sleep(1)\ndisplay('d')\nprint('b')"
    with SandboxClient(token_daemon.url, token=token_daemon.token) as sandbox:
        arrivals = [(time.monotonic(), item) for item in sandbox.invoke_stream("python",
                                                                                code=code)]
    *outputs, (result_at, result) = arrivals
    assert all(isinstance(item, ToolOutput) for _, item in outputs)
    assert result.status == "ok" and result.stdout == "a\nb\n"
    first_at, first = outputs[0]
    assert (first.kind, first.text) == ("stdout", "a\n") and result_at - first_at >= 0.8
    assert [i.item.data for _, i in outputs if i.kind == "display"] == [
        o.data for o in result.outputs]

    async def run_async() -> list[str]:
        async with AsyncSandboxClient(token_daemon.url, token=token_daemon.token) as sandbox:
            return [type(i).__name__ async for i in sandbox.invoke_stream("python",
                                                                         code="print(1)")]

    assert asyncio.run(run_async()) == ["ToolOutput", "Result"]


def test_the_agent_hands_tool_output_to_on_tool_output(token_daemon: TokenDaemon) -> None:
    seen: list[tuple[str, str, float]] = []

    def script(body: dict[str, Any], n: int) -> Reply:
        if last_tool_results(body):
            return text_reply("done")
        return tool_call_reply([("python", {"code": "import time\nprint('step 1', flush=True)"
                                                    "\ntime.sleep(1)\nprint('step 2')"})])

    def watch(call: Any, event: Any) -> None:
        seen.append((call.name, event.text, time.monotonic()))

    with ScriptedLLM(script) as llm, \
            SandboxClient(token_daemon.url, token=token_daemon.token) as sandbox:
        result = Agent(llm.url, "qwen2.5-7b-instruct", sandbox=sandbox,
                       on_tool_output=watch).act("Run it", tools=["python"])
    assert result.text == "done"
    assert [(name, text) for name, text, _ in seen] == [("python", "step 1\n"),
                                                         ("python", "step 2\n")]
    assert seen[1][2] - seen[0][2] >= 0.8  # the first step was seen while the call ran
    (record,) = result.tool_calls
    assert record.result is not None and record.result.stdout == "step 1\nstep 2\n"


def test_a_session_streams_its_calls(token_daemon: TokenDaemon) -> None:
    """``Session.invoke_stream``: the output as it comes, then the result, in the
    session's workspace and with its variables (sync and async)."""
    from sandboxd_client import ToolOutput

    with SandboxClient(token_daemon.url, token=token_daemon.token) as sandbox, \
            sandbox.session() as s:
        s.invoke("python", code="x = 41")
        items = list(s.invoke_stream("python", code="print(x + 1)"))
    assert isinstance(items[0], ToolOutput) and items[0].text == "42\n"
    assert items[-1].status == "ok" and items[-1].session == s.id  # type: ignore[union-attr]

    async def run_async() -> list[str]:
        async with (AsyncSandboxClient(token_daemon.url, token=token_daemon.token) as sandbox,
                    sandbox.session() as s):
            await s.invoke("python", code="y = 1")
            return [repr(i.text) if isinstance(i, ToolOutput) else i.status
                    async for i in s.invoke_stream("python", code="print(y)")]

    assert asyncio.run(run_async()) == ["'1\\n'", "ok"]
