"""Escaping untrusted text for terminals, logs and models (sandboxd.util.text)."""

from __future__ import annotations

import json

import pytest

from sandboxd.util.text import json_visible, visible


@pytest.mark.parametrize(("text", "shown"), [
    ("plain é 文字", "plain é 文字"),
    ("a\nb\r\tc", "a\\nb\\r\\tc"),
    ("\x1b]0;t\x07", "\\x1b]0;t\\x07"),
    ("\x9b\x85", "\\x9b\\x85"),
    ("\u202eabc\u2066\u200b\ufeff", "\\u202eabc\\u2066\\u200b\\ufeff"),
    ("\u00a0\u2028", "\\xa0\\u2028"),
    ("\ud800", "\\ud800"),
    ("\U000e0041", "\\U000e0041"),
    ("back\\slash\\n", "back\\\\slash\\\\n"),  # a literal backslash-n is not a newline escape
])
def test_visible(text: str, shown: str) -> None:
    assert visible(text) == shown
    assert visible(text).isprintable()


@pytest.mark.parametrize("value", [
    {"a": "x\x1b[2J\n\u202e\x85\U000e0041\ud800", "b": ["\u2028", 1]}, "plain", ["é"],
])
def test_json_visible_is_the_same_json_value(value: object) -> None:
    text = json_visible(json.dumps(value, ensure_ascii=False))
    assert text.isprintable()
    assert json.loads(text) == value
