"""Showing untrusted text: every character a terminal, a log reader or a model could be fooled
by is written as an escape, so that what is shown is one line that says exactly what the text
held.

"Fooled by" means every character ``str.isprintable`` rejects: C0 and C1 controls (newlines,
ESC of ANSI/OSC sequences, CSI ``\\x9b``), format characters (bidi overrides and isolates,
zero-width spaces and joiners, BOM), line and paragraph separators, spaces other than U+0020,
lone surrogates, private-use and unassigned code points. The backslash is doubled, so an
escape in the output can never be confused with one that was in the text.
"""

from __future__ import annotations

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def escape(char: str) -> str:
    """The escape of one character (``\\n``, ``\\x1b``, ``\\u202e``, ``\\U000e0001``)."""
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(text: str) -> str:
    """``text`` with every non-printable character (and the backslash) escaped."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(c if c.isprintable() and c != "\\" else escape(c) for c in text)


def json_visible(text: str) -> str:
    """A JSON text (``json.dumps(..., ensure_ascii=False)``) with every non-printable character
    written as a JSON ``\\uXXXX`` escape (a surrogate pair above U+FFFF): still the same JSON
    value, but nothing in it can move a cursor, start an escape sequence or reorder a line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _json_escape(c) for c in text)


def _json_escape(char: str) -> str:
    """The JSON escape of one character: ``\\uXXXX``, a surrogate pair above U+FFFF."""
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
