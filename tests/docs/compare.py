"""Comparing what a doc example shows with what the real run gave.

- JSON by shape (:func:`shape_problems`): the same keys at every level, lists element by
  element (a doc sample stands for a real result of the same call).
- JSON by value (:func:`value_problems`): the shape, and every scalar equal except at the
  paths the catalogue calls volatile (ids, timings); a string with ``…`` in the doc matches
  any text in place of each ``…``.
- Server-Sent Events (:func:`sse_problems`): the same events in the same order, each data
  compared by value; a data object ending in ``,…}`` lists only some of the real keys.
- Text (:func:`text_problems`): line by line after the catalogue's normalising patterns.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

ELLIPSIS = "…"


def _matches(doc: str, real: str) -> bool:
    if ELLIPSIS not in doc:
        return doc == real
    pattern = ".*".join(re.escape(part) for part in doc.split(ELLIPSIS))
    return re.fullmatch(pattern, real, re.S) is not None


def _volatile(path: str, volatile: Iterable[str]) -> bool:
    return any(path == v or path.startswith(v + ".") or path.startswith(v + "[")
               for v in volatile)


def shape_problems(doc: Any, real: Any, path: str = "") -> list[str]:
    """Where ``doc`` and ``real`` differ in keys (at any depth) or in list lengths."""
    if isinstance(doc, dict) and isinstance(real, dict):
        problems = [f"{path or '.'}: key {k!r} is missing from the doc"
                    for k in real if k not in doc]
        problems += [f"{path or '.'}: the doc shows key {k!r} that the real result lacks"
                     for k in doc if k not in real]
        for k in doc:
            if k in real:
                problems += shape_problems(doc[k], real[k], f"{path}.{k}" if path else k)
        return problems
    if isinstance(doc, list) and isinstance(real, list):
        if len(doc) != len(real):
            return [f"{path}: the doc shows {len(doc)} items, the real result {len(real)}"]
        return [p for i, (d, r) in enumerate(zip(doc, real, strict=True))
                for p in shape_problems(d, r, f"{path}[{i}]")]
    if isinstance(doc, dict | list) or isinstance(real, dict | list):
        return [f"{path}: the doc shows {_kind(doc)}, the real result {_kind(real)}"]
    return []


def value_problems(doc: Any, real: Any, volatile: Iterable[str] = (), path: str = "",
                   partial: bool = False) -> list[str]:
    """The shape problems (only the doc's keys when ``partial``), then every scalar that
    differs outside the ``volatile`` paths."""
    volatile = tuple(volatile)
    if _volatile(path, volatile):
        return []
    if isinstance(doc, dict) and isinstance(real, dict):
        problems = [] if partial else [f"{path or '.'}: key {k!r} is missing from the doc"
                                       for k in real if k not in doc]
        problems += [f"{path or '.'}: the doc shows key {k!r} that the real result lacks"
                     for k in doc if k not in real]
        for k in doc:
            if k in real:
                problems += value_problems(doc[k], real[k], volatile,
                                           f"{path}.{k}" if path else k)
        return problems
    if isinstance(doc, list) and isinstance(real, list):
        if len(doc) != len(real):
            return [f"{path}: the doc shows {len(doc)} items, the real result {len(real)}"]
        return [p for i, (d, r) in enumerate(zip(doc, real, strict=True))
                for p in value_problems(d, r, volatile, f"{path}[{i}]")]
    if isinstance(doc, str) and isinstance(real, str):
        ok = _matches(doc, real)
    else:
        ok = type(doc) is type(real) and doc == real
    return [] if ok else [f"{path or '.'}: the doc shows {doc!r}, the real result {real!r}"]


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    return "a list" if isinstance(value, list) else repr(value)


def sse_events(text: str) -> list[tuple[str, str]]:
    """``(event, data)`` of each event of a Server-Sent Events text (comments skipped)."""
    events: list[tuple[str, str]] = []
    name, data = "message", list[str]()
    for line in [*text.splitlines(), ""]:
        if not line:
            if data:
                events.append((name, "\n".join(data)))
            name, data = "message", list[str]()
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
    return events


def sse_problems(doc: str, real: str, volatile: Iterable[str] = ()) -> list[str]:
    """Where the doc's event stream differs from the real one."""
    shown, got = sse_events(doc), sse_events(real)
    if [n for n, _ in shown] != [n for n, _ in got]:
        return [f"events: the doc shows {[n for n, _ in shown]}, the real stream "
                f"{[n for n, _ in got]}"]
    problems: list[str] = []
    for i, ((name, d), (_, r)) in enumerate(zip(shown, got, strict=True)):
        partial = d.endswith(f",{ELLIPSIS}}}")
        d = d[:-len(f",{ELLIPSIS}}}")] + "}" if partial else d
        problems += value_problems(json.loads(d), json.loads(r), volatile,
                                   f"{name}#{i}", partial=partial)
    return problems


def text_problems(doc: str, real: str, patterns: Iterable[tuple[str, str]] = ()) -> list[str]:
    """Line by line, after each ``(regex, replacement)`` is applied to both sides."""
    def norm(text: str) -> list[str]:
        for pattern, replacement in patterns:
            text = re.sub(pattern, replacement, text)
        return [line.rstrip() for line in text.rstrip("\n").splitlines()]

    shown, got = norm(doc), norm(real)
    if shown == got:
        return []
    return [f"line {i + 1}: the doc shows {d!r}, the real output {g!r}"
            for i, (d, g) in enumerate(zip(shown, got, strict=False)) if d != g] + (
        [f"the doc shows {len(shown)} lines, the real output {len(got)}"]
        if len(shown) != len(got) else [])


def output_problems(doc: str, real: str, volatile: Iterable[str] = (),
                    patterns: Iterable[tuple[str, str]] = ()) -> list[str]:
    """What the doc shows against the real output: JSON by value when the doc's output is
    JSON, an event stream when it starts with ``event:``, else text."""
    if doc.lstrip().startswith("event:"):
        return sse_problems(doc, real, volatile)
    try:
        shown = json.loads(doc)
    except ValueError:
        return text_problems(doc, real, patterns)
    try:
        got = json.loads(real)
    except ValueError:
        return [f"the doc shows JSON, the real output is not: {real[:300]!r}"]
    return value_problems(shown, got, volatile)
