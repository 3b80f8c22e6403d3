"""Unit tests of the stream helpers: fragment assembly rules, text tool calls, <think>."""

from __future__ import annotations

from sandboxd_client.stream import (
    ThinkSplitter,
    ToolCallAssembler,
    parse_text_tool_calls,
    split_arguments,
    strip_think,
)


def frag(**kw: object) -> dict[str, object]:
    fn = {k: kw.pop(k) for k in ("name", "arguments") if k in kw}
    return {**kw, "function": fn}


def test_assign_once_and_concatenate() -> None:
    a = ToolCallAssembler()
    for piece in ['{"x"', ": 1", "}"]:
        a.feed(frag(index=0, id="same", type="function", name="f", arguments=piece))
    (call,) = a.finish()
    assert (call.id, call.name, call.arguments) == ("same", "f", {"x": 1})


def test_index_reuse_needs_name_and_new_id() -> None:
    a = ToolCallAssembler()
    a.feed(frag(index=0, id="a", name="f", arguments="{}"))
    a.feed(frag(index=0, id="b", arguments=""))  # fresh id, no name: same call
    a.feed(frag(index=0, id="c", name="g", arguments='{"y": 2}'))  # name + new id: new call
    calls = a.finish()
    assert [(c.id, c.name, c.arguments) for c in calls] == [("a", "f", {}), ("c", "g", {"y": 2})]


def test_split_concatenated_and_truncated() -> None:
    calls = split_arguments("id1", "f", '{"a": 1}{"a": 2} {"a": ')
    assert [c.arguments for c in calls] == [{"a": 1}, {"a": 2}, None]
    assert calls[0].id == "id1" and calls[1].id == "" and calls[2].parse_error
    (cut,) = split_arguments("x", "f", '{"a": "unterminated', truncated=True)
    assert cut.arguments is None and "length limit" in (cut.parse_error or "")
    (double,) = split_arguments("x", "f", '"{\\"a\\": 1}"')  # double-encoded JSON string
    assert double.arguments == {"a": 1}
    (not_obj,) = split_arguments("x", "f", "[1, 2]")
    assert not_obj.arguments is None and "JSON object" in (not_obj.parse_error or "")


def test_an_integer_too_long_to_parse_is_a_parse_error_not_a_crash() -> None:
    (call,) = split_arguments("x", "f", '{"n": ' + "9" * 5000 + "}")
    assert call.arguments is None and "digits" in (call.parse_error or ""), call


def test_generated_ids_are_unique_and_mistral_shaped() -> None:
    a = ToolCallAssembler()
    a.feed(frag(index=0, name="f", arguments='{"a": 1}{"a": 2}'))
    a.feed(frag(index=1, id="dup", name="f", arguments="{}"))
    a.feed(frag(index=2, id="dup", name="f", arguments="{}"))
    ids = [c.id for c in a.finish()]
    assert len(set(ids)) == 4
    assert all(len(i) == 9 and i.isalnum() for i in ids if i != "dup")


def test_text_formats() -> None:
    known = {"get_weather"}
    calls, rest = parse_text_tool_calls(
        '<think>hmm <tool_call>{"name": "get_weather", "arguments": {}}</tool_call></think>'
        'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
        '</tool_call>', known)
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Oslo"})]
    assert rest == "Sure." and calls[0].source == "text"
    calls, _ = parse_text_tool_calls(
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}', known)
    assert calls[0].arguments == {"city": "Rome"}  # unclosed tag, string arguments
    calls, _ = parse_text_tool_calls(
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', known)
    assert calls[0].arguments == {"city": "Paris"}
    calls, _ = parse_text_tool_calls(
        '{"name": "get_weather", "parameters": {"city": "Lima"}}', known)
    assert calls[0].arguments == {"city": "Lima"}
    calls, rest = parse_text_tool_calls('The JSON is {"name": "get_weather"}', known)
    assert calls == [] and rest.startswith("The JSON")
    calls, _ = parse_text_tool_calls('<|python_tag|>{"name": "other", "parameters": {}}', known)
    assert calls == []


def test_think_splitter_and_strip() -> None:
    s = ThinkSplitter()
    out = []
    for piece in ["Hi <th", "ink>sec", "ret</thi", "nk> there <", "3"]:
        out += s.feed(piece)
    out += s.flush()
    visible = "".join(t for r, t in out if not r)
    hidden = "".join(t for r, t in out if r)
    assert visible == "Hi  there <3" and hidden == "secret"
    assert strip_think("<think>a</think>b") == "b"
    assert strip_think("reasoning without opening tag</think>answer") == "answer"
    assert strip_think("<think>never closed") == ""


def test_split_think() -> None:
    from sandboxd_client.stream import split_think

    assert split_think("a<think>b</think>c<think>d") == ("ac", "bd")
    assert split_think("pre</think> post <think>x</think>!") == ("post !", "prex")
    assert split_think("no tags") == ("no tags", "")
