"""The policy's scan of ``python`` code for imports skips the parse of ASCII code without the
word ``import`` (the parse is daemon CPU paid on every call): it must find exactly what the parse
finds, in every case."""

from __future__ import annotations

import pytest

from sandboxd.policy.engine import imported_modules

CODES = [
    "x = 1\nprint(x)",
    "import os",
    "from json import dumps",
    "__import__('subprocess')",
    "importlib.import_module('socket')",
    "m = __builtins__['__imp' + 'ort__']('os')",
    "__\uff49mport__('os')",  # NFKC: the identifier is __import__
    "\uff49\uff4d\uff50\uff4f\uff52\uff54 os",  # not the keyword: a syntax error
    "s = 'import os'",
    "def f(:",
]


@pytest.mark.parametrize("code", CODES)
def test_the_scan_finds_what_the_parse_finds(code: str) -> None:
    # a non-ASCII comment makes the scan parse (the slow path) whatever the code holds
    assert imported_modules(code) == imported_modules(code + "\n# \u00e9")


def test_the_nfkc_spelling_of_import_is_seen() -> None:
    assert imported_modules("__\uff49mport__('os')") == [("os", [])]
