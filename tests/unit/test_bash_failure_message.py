"""A bash call's message comes from the kernel's answer, which user code in the kernel can
write too: the runner takes only its one shape (a kind, a line, the command's text), makes it
one plain bounded line, and never a value; any other bytes give no message and no error."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.plan import runner_module

bash_kernel = runner_module("bash_kernel")


@pytest.mark.parametrize(("status", "body", "message"), [
    (3, b"c2\1( exit 3 )", "line 2: ( exit 3 ): exit status 3"),
    (2, b"s3\1syntax error near unexpected token `then'",
     "line 3: syntax error near unexpected token `then'"),
    (1, b"c1\1a\nb\tc\x1b[31m", "line 1: a b c [31m: exit status 1"),
    (1, b"c1\1" + "é".encode() * 300, "line 1: " + "é" * 200 + ": exit status 1"),
    (0, b"c1\1false", None),  # a call that succeeded has no failure
    (1, b"c0\1false", None), (1, b"c-1\1false", None), (1, b"c1234567890\1x", None),
    (1, b"x1\1false", None), (1, b"c1false", None), (1, b"", None),
    (1, b'{"value": 42}', None)])  # never a value, whatever the answer holds
def test_only_the_answers_shape_gives_a_message(status: int, body: bytes,
                                                message: str | None) -> None:
    assert bash_kernel.failure_message(status, body) == message
    answer = bash_kernel.BashKernel.answer_body(bytes([status]) + body)
    assert answer == (json.dumps({"message": message}).encode() if message else b"")


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 255), st.binary(max_size=400))
def test_any_answer_gives_one_plain_bounded_line_or_none(status: int, body: bytes) -> None:
    message = bash_kernel.failure_message(status, body)
    if message is not None:
        assert message.startswith("line ") and message.isprintable(), message
        assert len(message) <= bash_kernel.MAX_COMMAND_CHARS + 40, message
