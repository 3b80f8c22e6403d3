"""The agent loop's rules, against the scripted server with local function tools."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest

from sandboxd_client import Agent, ToolCallRequest
from tests.client.scripted_llm import (
    Reply,
    ScriptedLLM,
    chunk,
    last_tool_results,
    text_reply,
    tool_call_reply,
    usage_chunk,
)
from tests.support.wait import async_wait_until


def echo(text: str) -> str:
    """Echo text back.

    Args:
        text: What to echo.
    """
    return text


def answer_with_results(body: dict[str, Any]) -> Reply:
    return text_reply(" | ".join(m["content"] for m in last_tool_results(body)))


def test_infinite_identical_calls_stopped_by_loop_guard() -> None:
    runs: list[str] = []

    def ping(host: str) -> str:
        """Ping a host.

        Args:
            host: Host name.
        """
        runs.append(host)
        return "pong"

    def script(body: dict[str, Any], n: int) -> Reply:
        if body.get("tools"):  # a model that never stops calling
            return tool_call_reply([("ping", {"host": "a"})], ids=[f"id{n}"])
        return text_reply("I keep getting pong.")

    with ScriptedLLM(script) as llm:
        result = Agent(llm.url, "m").act("ping a", [ping], max_rounds=20)
    assert llm.rejections == []
    assert runs == ["a", "a"]  # the third identical call was not run
    guard = result.tool_calls[2]
    assert guard.error is not None and guard.error.kind == "loop_guard"
    assert "not run again" in guard.content
    assert result.stop_reason == "loop_guard"
    assert result.rounds == 4  # 3 tool rounds, then one round without tools
    assert "tools" not in llm.requests[-1]
    assert result.text == "I keep getting pong."


def test_infinite_varying_calls_stopped_by_max_rounds() -> None:
    def script(body: dict[str, Any], n: int) -> Reply:
        if body.get("tools"):
            return tool_call_reply([("echo", {"text": f"step {n}"})], ids=[f"id{n}"])
        return text_reply("Out of rounds; here is what I have.")

    with ScriptedLLM(script) as llm:
        result = Agent(llm.url, "m").act("go", [echo], max_rounds=4)
    assert llm.rejections == []
    assert result.rounds == 4
    assert [r.content for r in result.tool_calls] == ["step 0", "step 1", "step 2"]
    assert result.stop_reason == "max_rounds"
    assert [("tools" in r) for r in llm.requests] == [True, True, True, False]
    assert result.text == "Out of rounds; here is what I have."


def test_model_calling_tools_without_tools_is_answered_and_stopped() -> None:
    def script(body: dict[str, Any], n: int) -> Reply:  # ignores that no tools were offered
        return tool_call_reply([("echo", {"text": f"x{n}"})], ids=[f"id{n}"])

    with ScriptedLLM(script) as llm:
        result = Agent(llm.url, "m").act("go", [echo], max_rounds=2)
    assert result.rounds == 2 and result.stop_reason == "max_rounds"
    last = result.new_messages[-1]
    assert last["role"] == "tool" and last["tool_call_id"] == "id1"
    assert last["content"].startswith("Not run: the tool-call limit")
    # and the history is still valid for a strict server
    with ScriptedLLM(lambda b, n: text_reply("fine")) as llm2:
        Agent(llm2.url, "m").act([*result.messages, {"role": "user", "content": "ok?"}])
    assert llm2.rejections == []


def boom(x: int) -> int:
    """Always fails.

    Args:
        x: Anything.
    """
    raise ValueError(f"cannot handle {x}")


def choose(unit: str, count: int = 1) -> str:
    """Pick a unit.

    Args:
        unit: The unit. (choices: ["celsius", "fahrenheit"])
        count: How many.
    """
    return f"{count} {unit}"


def test_error_messages_per_class() -> None:
    stream = [chunk({"tool_calls": [
        {"index": 0, "id": "e0", "type": "function",
         "function": {"name": "choose", "arguments": '{"unit": "celsius"'}},
        {"index": 1, "id": "e1", "type": "function",
         "function": {"name": "nope", "arguments": "{}"}},
        {"index": 2, "id": "e2", "type": "function",
         "function": {"name": "choose", "arguments": '{"unit": "kelvin"}'}},
        {"index": 3, "id": "e3", "type": "function",
         "function": {"name": "choose", "arguments": '{"count": 2}'}},
        {"index": 4, "id": "e4", "type": "function",
         "function": {"name": "choose", "arguments": '{"unit": "celsius", "extra": 1}'}},
        {"index": 5, "id": "e5", "type": "function",
         "function": {"name": "boom", "arguments": '{"x": 7}'}},
        {"index": 6, "id": "e6", "type": "function",
         "function": {"name": "choose", "arguments": '{"unit": "celsius", "count": 3}'}},
    ]}), chunk({}, "tool_calls")]
    with ScriptedLLM(lambda b, n: Reply(stream) if n == 0 else answer_with_results(b)) as llm:
        result = Agent(llm.url, "m").act("x", [choose, boom])
    assert llm.rejections == []
    by_id = {r.call.id: r for r in result.tool_calls}
    assert [m["tool_call_id"] for m in result.new_messages if m["role"] == "tool"] == [
        f"e{i}" for i in range(7)]
    assert by_id["e0"].error.kind == "bad_json"
    assert "not valid JSON" in by_id["e0"].content and "choose" in by_id["e0"].content
    assert by_id["e1"].error.kind == "unknown_tool"
    assert "no tool named `nope`" in by_id["e1"].content
    assert "Available tools: boom, choose" in by_id["e1"].content
    assert by_id["e2"].error.kind == "invalid_arguments"
    assert by_id["e2"].error.field == "unit"
    assert "'unit'" in by_id["e2"].content and '"celsius", "fahrenheit"' in by_id["e2"].content
    assert by_id["e3"].error.field == "unit" and "is required" in by_id["e3"].content
    assert by_id["e4"].error.field == "extra"
    assert "not a parameter" in by_id["e4"].content
    assert by_id["e5"].error.kind == "tool_error"
    assert "raised ValueError: cannot handle 7" in by_id["e5"].content
    assert by_id["e6"].ok and by_id["e6"].content == "3 celsius"


def test_local_tool_timeout() -> None:
    def slow(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)  # sleep-ok: a test double's slow tool
        return "woke"

    script = lambda b, n: (tool_call_reply([("slow", {"seconds": 2})]) if n == 0  # noqa: E731
                           else answer_with_results(b))
    with ScriptedLLM(script) as llm:
        result = Agent(llm.url, "m").act("x", [slow], tool_timeout_s=0.2)
    rec = result.tool_calls[0]
    assert rec.error is not None and rec.error.kind == "timeout"
    assert "timed out after 0.2 s" in rec.content


def test_invalid_request_hook_rewrites_replaces_or_aborts() -> None:
    stream = [chunk({"tool_calls": [
        {"index": 0, "id": "h0", "type": "function",
         "function": {"name": "ECHO", "arguments": '{"text": "fixed"}'}},
        {"index": 1, "id": "h1", "type": "function",
         "function": {"name": "missing", "arguments": "{}"}},
    ]}), chunk({}, "tool_calls")]
    seen: list[str] = []

    def hook(call: ToolCallRequest, error: Any) -> Any:
        seen.append(error.kind)
        if call.name == "ECHO":  # rewrite: the model got the case wrong
            return ToolCallRequest(call.id, "echo", call.arguments)
        return "custom: use echo"

    with ScriptedLLM(lambda b, n: Reply(stream) if n == 0 else answer_with_results(b)) as llm:
        result = Agent(llm.url, "m").act("x", [echo], handle_invalid_tool_request=hook)
    assert seen == ["unknown_tool", "unknown_tool"]
    assert result.text == "fixed | custom: use echo"
    assert [m["tool_call_id"] for m in result.new_messages if m["role"] == "tool"] == ["h0", "h1"]

    class Abort(Exception):
        pass

    def abort(call: ToolCallRequest, error: Any) -> None:
        raise Abort(error.message)

    added: list[dict[str, Any]] = []
    with ScriptedLLM(lambda b, n: Reply(stream)) as llm, pytest.raises(Abort):
        Agent(llm.url, "m").act("x", [echo], handle_invalid_tool_request=abort,
                                on_message=added.append)
    # the aborted round's calls were still answered, so the history stays valid
    assert [m.get("tool_call_id") for m in added if m["role"] == "tool"] == ["h0", "h1"]


def test_parallel_bounded_and_in_request_order() -> None:
    active = 0
    peak = 0
    lock = threading.Lock()

    def work(n: int, delay: float) -> int:
        """Work a while.

        Args:
            n: Job number.
            delay: Seconds.
        """
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(delay)  # sleep-ok: a test double's work that takes ``delay`` seconds
        with lock:
            active -= 1
        return n

    calls = [("work", {"n": i, "delay": 0.3 - 0.05 * i}) for i in range(6)]

    def script(b: dict[str, Any], n: int) -> Reply:
        return tool_call_reply(calls) if n == 0 else answer_with_results(b)

    with ScriptedLLM(script) as llm:
        result = Agent(llm.url, "m").act("x", [work], parallel_tool_calls=True, max_parallel=3)
    assert peak == 3
    assert result.text == "0 | 1 | 2 | 3 | 4 | 5"
    peak = 0
    with ScriptedLLM(script) as llm:
        Agent(llm.url, "m").act("x", [work])
    assert peak == 1  # sequential by default


def test_tool_output_budget_keeps_head_and_tail() -> None:
    def big() -> str:
        """Produce a lot of text."""
        return "HEAD" + "x" * 50_000 + "TAIL"

    script = lambda b, n: tool_call_reply([("big", {})]) if n == 0 else text_reply("ok")  # noqa: E731
    with ScriptedLLM(script) as llm:
        Agent(llm.url, "m", tool_output_chars=1000).act("x", [big])
    content = llm.requests[1]["messages"][-1]["content"]
    assert content.startswith("HEAD") and content.endswith("TAIL")
    assert len(content) < 1200
    assert "characters omitted" in content and "50008 characters" in content


def test_context_trimmed_to_budget_using_usage() -> None:
    history: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for i in range(6):
        history += [
            {"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": f"old{i}", "type": "function",
                 "function": {"name": "echo", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"old{i}", "name": "echo",
             "content": f"result {i} " + "y" * 2000},
            {"role": "assistant", "content": f"answer {i}"},
        ]
    history.append({"role": "user", "content": "latest question"})

    def script(b: dict[str, Any], n: int) -> Reply:
        # the server counts 1 token per 2 characters: the agent must learn that from usage
        prompt = sum(len(json.dumps(m)) for m in b["messages"]) // 2
        return Reply([*text_reply(f"answer {n}").chunks, usage_chunk(prompt, 2)])

    with ScriptedLLM(script) as llm:
        agent = Agent(llm.url, "m", context_tokens=4000, max_tokens=500)
        agent.act(history)  # first request: estimated at 4 chars/token, learns ~2
        assert agent.chars_per_token == pytest.approx(2.0, abs=0.05)
        agent.act(history)
    first, second = llm.requests[0]["messages"], llm.requests[1]["messages"]
    assert llm.rejections == []
    assert first == history  # at the default 4 chars/token it seemed to fit
    assert second[0] == history[0] and second[-1] == history[-1]
    size = lambda ms: sum(len(json.dumps(m)) for m in ms)  # noqa: E731
    assert size(history) / 2 > 3500  # the full history would not fit
    assert size(second) / 2 <= 3500  # what was sent does, by the server's own count
    assert size(second) < size(first)
    tool_contents = [m["content"] for m in second if m["role"] == "tool"]
    assert any("removed to fit" in c for c in tool_contents)  # oldest tool results go first
    assert "y" * 2000 in tool_contents[-1]  # the newest result was kept


def test_callbacks_order() -> None:
    events: list[str] = []
    script = lambda b, n: (tool_call_reply([("echo", {"text": "hi"})]) if n == 0  # noqa: E731
                           else text_reply("done", pieces=2))
    with ScriptedLLM(script) as llm:
        Agent(llm.url, "m").act(
            "x", [echo],
            on_round_start=lambda r: events.append(f"start{r}"),
            on_round_end=lambda r: events.append(f"end{r}"),
            on_message=lambda m: events.append(m["role"]),
            on_fragment=lambda f: events.append(f"frag:{f.content}"),
            on_tool_result=lambda rec: events.append(f"result:{rec.content}"),
        )
    assert events == ["start0", "assistant", "tool", "result:hi", "end0",
                      "start1", "frag:do", "frag:ne", "assistant", "end1"]


async def test_cancellation_closes_stream_and_answers_pending_calls() -> None:
    started = asyncio.Event()

    async def wait_forever(label: str) -> str:
        """Wait forever.

        Args:
            label: A label.
        """
        started.set()
        await asyncio.sleep(3600)  # sleep-ok: a test double's tool that runs until cancelled
        return label

    script = lambda b, n: tool_call_reply([("wait_forever", {"label": "a"}),  # noqa: E731
                                           ("wait_forever", {"label": "b"})])
    added: list[dict[str, Any]] = []
    with ScriptedLLM(script) as llm:
        task = asyncio.create_task(Agent(llm.url, "m").aact(
            "x", [wait_forever], on_message=added.append, parallel_tool_calls=True))
        await asyncio.wait_for(started.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    tools = [m for m in added if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == ["call_0", "call_1"]
    assert all(m["content"].startswith("Cancelled") for m in tools)


async def test_cancellation_during_streaming() -> None:
    slow = Reply(text_reply("x" * 200, pieces=200).chunks, delay_s=0.05)
    got = asyncio.Event()
    with ScriptedLLM(lambda b, n: slow) as llm:
        task = asyncio.create_task(Agent(llm.url, "m").aact("x", on_fragment=lambda f: got.set()))
        await asyncio.wait_for(got.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await async_wait_until(lambda: llm.disconnects, timeout=5,
                               what="the server to see the stream closed")
    assert llm.disconnects == 1  # the server saw the stream closed


def test_undescribable_function_raises_at_registration() -> None:
    from sandboxd_client import ToolDefinitionError

    def untyped(x):  # type: ignore[no-untyped-def]
        """No types."""
        return x

    with ScriptedLLM() as llm, pytest.raises(ToolDefinitionError, match="no type annotation"):
        Agent(llm.url, "m").act("x", [untyped])
    assert llm.requests == []  # nothing was sent


def test_tool_wrapper_names_and_async_functions() -> None:
    from sandboxd_client import tool

    @tool(name="mul", description="Multiply two integers.")
    async def multiply_ints(a: int, b: int) -> int:
        return a * b

    script = lambda b, n: (tool_call_reply([("mul", {"a": 6, "b": 7})]) if n == 0  # noqa: E731
                           else answer_with_results(b))
    with ScriptedLLM(script) as llm:
        result = Agent(llm.url, "m").act("6*7", [multiply_ints, echo])
    offered = {t["function"]["name"]: t["function"] for t in llm.requests[0]["tools"]}
    assert set(offered) == {"mul", "echo"}
    assert offered["mul"]["description"] == "Multiply two integers."
    assert result.text == "42"
    assert result.tool_calls[0].value == 42


def test_duplicate_tool_names_and_sandbox_names_without_sandbox() -> None:
    from sandboxd_client import ToolDefinitionError

    with ScriptedLLM() as llm:
        with pytest.raises(ToolDefinitionError, match="two tools are named 'echo'"):
            Agent(llm.url, "m").act("x", [echo, echo])
        with pytest.raises(ValueError, match="need Agent\\(sandbox="):
            Agent(llm.url, "m").act("x", ["python"])
    assert llm.requests == []


async def test_sync_act_inside_a_running_loop_is_refused() -> None:
    with pytest.raises(RuntimeError, match="aact"):
        Agent("http://127.0.0.1:9/v1", "m").act("x")


def test_system_prompt_and_messages_input() -> None:
    with ScriptedLLM(lambda b, n: text_reply("hi")) as llm:
        agent = Agent(llm.url, "m", system_prompt="You are terse.", temperature=0.2,
                      max_tokens=64, extra_body={"top_k": 20})
        history = [{"role": "user", "content": "hello"}]
        result = agent.act(history)
    body = llm.requests[0]
    assert body["messages"][0] == {"role": "system", "content": "You are terse."}
    assert (body["temperature"], body["max_tokens"], body["top_k"]) == (0.2, 64, 20)
    assert "tools" not in body
    assert history == [{"role": "user", "content": "hello"}]  # the caller's list is not changed
    assert [m["role"] for m in result.messages] == ["system", "user", "assistant"]
