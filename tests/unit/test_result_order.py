"""A result's stdout, stderr and display items in execution order
(:meth:`Result.sequence`), in what the model reads and in the MCP content list."""

from __future__ import annotations

import base64

from sandboxd.api.mcp.results import call_result
from sandboxd.models import Reason, Result
from sandboxd.results.items import Output, Position
from sandboxd_client.render import format_result
from tests.unit.test_outputs import tiny_png


def _result(stdout: str, stderr: str, *outputs: Output, **fields: object) -> Result:
    result = Result.build(("inv_1", "python", None), "container", Reason.exited, exit_code=0,
                          stdout=stdout, stderr=stderr, **fields)
    result.outputs = list(outputs)
    return result


def _item(text: str, out: int | None, err: int = 0, png: bytes | None = None) -> Output:
    data = {"text/plain": text}
    if png is not None:
        data["image/png"] = base64.b64encode(png).decode()
    return Output(data=data, at=None if out is None else Position(stdout=out, stderr=err))


def test_the_sequence_cuts_the_streams_at_each_items_position() -> None:
    first, second = _item("one", 2, 0), _item("two", 4, 5)
    result = _result("a\nb\nc\n", "warn\n", first, second)
    assert result.sequence() == [("stdout", "a\n"), first, ("stdout", "b\n"),
                                 ("stderr", "warn\n"), second, ("stdout", "c\n")]


def test_positions_past_the_text_and_items_without_one() -> None:
    cut, old = _item("cut", 99, 99), _item("old", None)  # beyond a cut output; older daemon
    result = _result("a\n", "", old, cut)
    assert result.sequence() == [("stdout", "a\n"), cut, old]
    assert _result("", "").sequence() == []


def test_the_model_and_an_mcp_host_read_it_in_order() -> None:
    png = tiny_png(8, 6)
    plot = _item("<Figure>", 7, png=png)
    result = _result("before\nafter\n", "", plot, value=[3, 2], value_repr="(3, 2)")
    assert format_result(result) == ("stdout:\nbefore\ndisplay:\n[image: 8x6 png]\n"
                                     "stdout:\nafter\nvalue: (3, 2)")
    content = call_result(result).content
    assert [c.type for c in content] == ["text", "image", "text"]
    assert content[0].text == "stdout:\nbefore\ndisplay:\n[image: 8x6 png]"
    assert base64.b64decode(content[1].data) == png
    assert content[2].text == "stdout:\nafter\nvalue: (3, 2)"


def test_truncation_notes_follow_the_last_part_of_their_stream() -> None:
    result = _result("a\nb", "", _item("x", 2))
    result.truncated.stdout = True
    assert format_result(result) == ("stdout:\na\ndisplay:\nx\nstdout:\nb\n"
                                     "(stdout was cut at the sandbox output limit)")
