"""The agent against a scripted OpenAI-compatible server replaying real-world stream shapes.

Every variant streams the same two calls — add(a=1, b=2) and add(a=3, b=4) — in the shape some
real server uses; the agent must run exactly those two calls, answer each with one tool message
(the server answers 400 otherwise), and return the text of the next turn.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sandboxd_client import Agent, Fragment
from tests.client.scripted_llm import (
    Reply,
    ScriptedLLM,
    chunk,
    last_tool_results,
    text_reply,
    usage_chunk,
)

A1 = json.dumps({"a": 1, "b": 2})
A2 = json.dumps({"a": 3, "b": 4})


def pieces(text: str, n: int) -> list[str]:
    size = max(1, -(-len(text) // n))
    return [text[i:i + size] for i in range(0, len(text), size)]


def tc(**fields: Any) -> dict[str, Any]:
    """A delta carrying one tool-call fragment."""
    frag: dict[str, Any] = {}
    for key in ("index", "id", "type"):
        if key in fields:
            frag[key] = fields[key]
    fn = {k: fields[k] for k in ("name", "arguments") if k in fields}
    if fn:
        frag["function"] = fn
    return chunk({"tool_calls": [frag]})


def interleaved_many_chunks() -> list[Any]:
    out: list[Any] = [chunk({"role": "assistant", "content": None}),
                      tc(index=0, id="call_a", type="function", name="add", arguments=""),
                      tc(index=1, id="call_b", type="function", name="add", arguments="")]
    for p0, p1 in zip(pieces(A1, 7), pieces(A2, 7), strict=False):
        out += [tc(index=0, arguments=p0), tc(index=1, arguments=p1)]
    return [*out, chunk({}, "tool_calls")]


def each_call_one_chunk() -> list[Any]:
    return [chunk({"role": "assistant", "content": "", "tool_calls": [
        {"index": 0, "id": "c1", "type": "function", "function": {"name": "add", "arguments": A1}},
        {"index": 1, "id": "c2", "type": "function",
         "function": {"name": "add", "arguments": {"a": 3, "b": 4}}},  # an object, not a string
    ]}), chunk({}, "tool_calls")]


def index_zero_reused() -> list[Any]:
    out: list[Any] = [tc(index=0, id="first", type="function", name="add")]
    out += [tc(index=0, arguments=p) for p in pieces(A1, 3)]
    out += [tc(index=0, id="second", type="function", name="add")]
    out += [tc(index=0, arguments=p) for p in pieces(A2, 3)]
    return [*out, chunk({}, "tool_calls")]


def no_index() -> list[Any]:
    out: list[Any] = [tc(id="n1", type="function", name="add")]
    out += [tc(arguments=p) for p in pieces(A1, 4)]
    out += [tc(id="n2", type="function", name="add")]
    out += [tc(arguments=p) for p in pieces(A2, 4)]
    return [*out, chunk({}, "tool_calls")]


def id_name_repeated() -> list[Any]:
    out: list[Any] = [tc(index=0, id="r1", type="function", name="add", arguments=p)
                      for p in pieces(A1, 5)]
    out += [tc(index=1, id="r2", type="function", name="add", arguments=p) for p in pieces(A2, 5)]
    return [*out, chunk({}, "tool_calls")]


def nameless_fresh_ids() -> list[Any]:
    out: list[Any] = [tc(index=0, id="h0", type="function", name="add", arguments="")]
    out += [tc(index=0, id=f"frag{i}", arguments=p) for i, p in enumerate(pieces(A1, 4))]
    out += [tc(index=1, id="h1", type="function", name="add", arguments="")]
    out += [tc(index=1, id=f"frag{i + 10}", arguments=p) for i, p in enumerate(pieces(A2, 4))]
    return [*out, chunk({}, "tool_calls")]


def reasoning_first() -> list[Any]:
    out: list[Any] = [chunk({"role": "assistant", "reasoning_content": "I should "}),
                      chunk({"reasoning_content": "add both pairs."}),
                      chunk({"reasoning": " (llama.cpp/Ollama spelling)"})]
    return out + interleaved_many_chunks()[1:]


def hermes_text() -> list[Any]:
    text = (f'<think>two sums</think>Let me add.\n<tool_call>\n{{"name": "add", "arguments": {A1}}}'
            f'\n</tool_call>\n<tool_call>\n{{"name": "add", "arguments": {A2}}}\n</tool_call>')
    return [chunk({"role": "assistant", "content": p, "tool_calls": []})
            for p in pieces(text, 9)] + [chunk({}, "stop")]


def llama_python_tag() -> list[Any]:
    text = (f'<|python_tag|>{{"name": "add", "parameters": {A1}}}; '
            f'{{"name": "add", "parameters": {A2}}}<|eom_id|>')
    return [chunk({"content": p}) for p in pieces(text, 6)] + [chunk({}, "stop")]


def mistral_tool_calls() -> list[Any]:
    text = (f'[TOOL_CALLS][{{"name": "add", "arguments": {A1}}}, '
            f'{{"name": "add", "arguments": {A2}}}]')
    return [chunk({"content": p}) for p in pieces(text, 5)] + [chunk({}, "stop")]


def concatenated_objects() -> list[Any]:
    out: list[Any] = [tc(index=0, id="cc", type="function", name="add")]
    out += [tc(index=0, arguments=p) for p in pieces(A1 + A2, 6)]  # '{...}{...}' in one slot
    return [*out, chunk({}, "tool_calls")]


def think_in_content_then_calls() -> list[Any]:
    out: list[Any] = [chunk({"content": p}) for p in ["<thi", "nk>pon", "dering</th", "ink>"]]
    return out + interleaved_many_chunks()


def legacy_function_call() -> list[Any]:
    """Old servers (llama-cpp-python, early vLLM) stream ``delta.function_call``: one call."""
    out: list[Any] = [chunk({"role": "assistant", "function_call": {"name": "add",
                                                                     "arguments": ""}})]
    out += [chunk({"function_call": {"arguments": p}}) for p in pieces(A1, 4)]
    return [*out, chunk({}, "function_call")]


VARIANTS = {
    "parallel calls split across many interleaved chunks": interleaved_many_chunks,
    "each call complete in one chunk": each_call_one_chunk,
    "index 0 reused with different ids": index_zero_reused,
    "no index": no_index,
    "id and name repeated on every chunk": id_name_repeated,
    "nameless fragments each with a fresh id": nameless_fresh_ids,
    "reasoning deltas first": reasoning_first,
    "<tool_call> in content with empty tool_calls": hermes_text,
    "llama 3 <|python_tag|>": llama_python_tag,
    "mistral [TOOL_CALLS]": mistral_tool_calls,
    "}{ concatenated in one slot": concatenated_objects,
    "<think> split across chunks, then calls": think_in_content_then_calls,
}


def make_add(seen: list[tuple[int, int]]):  # type: ignore[no-untyped-def]
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first addend.
            b: The second addend.
        """
        seen.append((a, b))
        return a + b

    return add


def answer_from_results(body: dict[str, Any]) -> Reply:
    results = [m["content"] for m in last_tool_results(body)]
    return text_reply("sums: " + ", ".join(results))


def test_legacy_function_call_delta() -> None:
    stream = legacy_function_call()
    seen: list[tuple[int, int]] = []
    with ScriptedLLM(lambda b, n: Reply(stream) if n == 0 else answer_from_results(b)) as llm:
        result = Agent(llm.url, "m").act("x", [make_add(seen)])
    assert seen == [(1, 2)]
    assert result.text == "sums: 3"
    assert llm.rejections == []  # answered as a tool message with a generated id


@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
def test_stream_variant_runs_both_calls(variant: str) -> None:
    stream = VARIANTS[variant]()

    def script(body: dict[str, Any], n: int) -> Reply:
        return Reply(stream) if n == 0 else answer_from_results(body)

    seen: list[tuple[int, int]] = []
    fragments: list[Fragment] = []
    with ScriptedLLM(script) as llm:
        agent = Agent(llm.url, "scripted")
        result = agent.act("add 1+2 and 3+4", [make_add(seen)],
                           on_fragment=fragments.append)
    assert llm.rejections == []
    assert seen == [(1, 2), (3, 4)]
    assert result.text == "sums: 3, 7"
    assert result.rounds == 2
    assert result.stop_reason == "answer"
    # exactly one tool message per call, with id and name, in request order
    assistant = result.new_messages[0]
    ids = [c["id"] for c in assistant["tool_calls"]]
    assert len(ids) == 2 and len(set(ids)) == 2
    tools = [m for m in result.new_messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == ids
    assert [m["name"] for m in tools] == ["add", "add"]
    assert [m["content"] for m in tools] == ["3", "7"]
    # what was sent back to the server is exactly this history
    sent = llm.requests[1]["messages"]
    assert sent[-3]["tool_calls"] == assistant["tool_calls"]
    for call in assistant["tool_calls"]:
        json.loads(call["function"]["arguments"])
    text_pieces = "".join(f.content for f in fragments if not f.reasoning)
    assert "<think>" not in text_pieces and "pondering" not in text_pieces


def test_reasoning_kept_apart_from_content() -> None:
    stream = reasoning_first()
    script = lambda body, n: Reply(stream) if n == 0 else answer_from_results(body)  # noqa: E731
    fragments: list[tuple[Fragment, int]] = []
    with ScriptedLLM(script) as llm:
        result = Agent(llm.url, "m").act("x", [make_add([])],
                                         on_fragment=lambda f, r: fragments.append((f, r)))
    reasoning = "".join(f.content for f, _ in fragments if f.reasoning)
    assert reasoning == "I should add both pairs. (llama.cpp/Ollama spelling)"
    assert result.reasoning == reasoning
    assert result.new_messages[0]["content"] == ""
    assert all(r == 0 for f, r in fragments if f.reasoning)
    assert "should" not in result.text


def test_text_tool_calls_only_for_registered_names() -> None:
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    with ScriptedLLM(lambda body, n: text_reply(text)) as llm:
        result = Agent(llm.url, "m").act("x", [make_add([])])
    assert result.rounds == 1
    assert result.text == text
    assert "tool_calls" not in result.new_messages[0]


def test_length_mid_arguments_is_answered_then_retried() -> None:
    cut = [tc(index=0, id="t1", type="function", name="add", arguments='{"a": 1, "b"'),
           chunk({}, "length")]

    def script(body: dict[str, Any], n: int) -> Reply:
        if n == 0:
            return Reply(cut)
        if n == 1:
            (msg,) = last_tool_results(body)
            assert "length limit" in msg["content"] and "not valid JSON" in msg["content"]
            return Reply([tc(index=0, id="t2", type="function", name="add", arguments=A1),
                          chunk({}, "tool_calls")])
        return answer_from_results(body)

    seen: list[tuple[int, int]] = []
    with ScriptedLLM(script) as llm:
        result = Agent(llm.url, "m").act("x", [make_add(seen)])
    assert llm.rejections == []
    assert seen == [(1, 2)]
    assert result.text == "sums: 3"
    assert result.tool_calls[0].error is not None
    assert result.tool_calls[0].error.kind == "bad_json"
    # the invalid arguments were not echoed back as the call's arguments
    assert json.loads(llm.requests[1]["messages"][-2]["tool_calls"][0]["function"]["arguments"]) \
        == {}


def test_empty_arguments_mean_empty_object() -> None:
    calls: list[str] = []

    def now() -> str:
        """The current time."""
        calls.append("now")
        return "noon"

    stream = [tc(index=0, id="z", type="function", name="now", arguments=""), chunk({}, "stop")]
    with ScriptedLLM(lambda b, n: Reply(stream) if n == 0 else answer_from_results(b)) as llm:
        result = Agent(llm.url, "m").act("time?", [now])
    assert calls == ["now"]
    assert result.text == "sums: noon"


def test_sloppy_sse_without_blank_lines_and_usage_chunk() -> None:
    stream = [*text_reply("all good", pieces=4).chunks, usage_chunk(50, 3)]
    with ScriptedLLM(lambda b, n: Reply(stream, blank_lines=False)) as llm:
        agent = Agent(llm.url, "m")
        result = agent.act("hi")
    assert result.text == "all good"
    assert result.usage["prompt_tokens"] == 50
    assert llm.requests[0]["stream"] is True
    assert llm.requests[0]["stream_options"] == {"include_usage": True}
    # the estimate was calibrated with the server's count
    sent = sum(len(json.dumps(m)) for m in llm.requests[0]["messages"])
    assert agent.chars_per_token == pytest.approx(max(1.0, sent / 50))


def test_server_ignoring_stream_flag() -> None:
    full = {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "j1", "type": "function", "function": {"name": "add", "arguments": A1}},
            {"id": "j2", "type": "function", "function": {"name": "add", "arguments": A2}}]},
        "finish_reason": "tool_calls"}]}
    with ScriptedLLM(lambda b, n: Reply(json_body=full) if n == 0
                     else answer_from_results(b)) as llm:
        result = Agent(llm.url, "m").act("x", [make_add([])])
    assert result.text == "sums: 3, 7"


def test_strict_server_rejects_unanswered_tool_call() -> None:
    """The scripted server really enforces the pairing rule (so the tests above can fail)."""
    import httpx

    bad = {"model": "m", "stream": True, "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "name": "f", "content": "1"},
        {"role": "user", "content": "and?"}]}
    with ScriptedLLM() as llm:
        r = httpx.post(f"{llm.url}/chat/completions", json=bad)
    assert r.status_code == 400
    assert "'b'" in r.json()["error"]["message"]


def test_llm_http_error_is_raised() -> None:
    from sandboxd_client import LLMError

    with ScriptedLLM(lambda b, n: Reply(status=500, json_body={"error": "model not loaded"})) \
            as llm, pytest.raises(LLMError) as info:
        Agent(llm.url, "m").act("x")
    assert info.value.status == 500
    assert "model not loaded" in str(info.value)


def test_stream_options_rejected_is_retried_without() -> None:
    def script(body: dict[str, Any], n: int) -> Reply:
        if "stream_options" in body:
            return Reply(status=400, json_body={"error": "unknown field stream_options"})
        return text_reply("ok")

    with ScriptedLLM(script) as llm:
        agent = Agent(llm.url, "m")
        assert agent.act("x").text == "ok"
        assert agent.act("y").text == "ok"
    assert len(llm.requests) == 3  # one refusal, then never again


def test_think_blocks_never_reach_answer_or_history() -> None:
    """Qwen3/DeepSeek-R1 templates open <think> in the prompt: only </think> is streamed."""
    pieces_ = ["Let me thi", "nk: 2+2.</th", "ink>\n\nThe answer ", "is 4."]
    stream = [chunk({"content": p}) for p in pieces_] + [chunk({}, "stop")]
    with ScriptedLLM(lambda b, n: Reply(stream)) as llm:
        result = Agent(llm.url, "m").act("2+2?")
    assert result.text == "The answer is 4."
    assert result.reasoning == "Let me think: 2+2."
    assert result.new_messages == [{"role": "assistant", "content": "The answer is 4."}]
