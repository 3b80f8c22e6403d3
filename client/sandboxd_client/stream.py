"""Parsing what OpenAI-compatible servers stream back: SSE events, tool-call fragments, and
tool calls written into the text by models whose server did not parse them.

Rules of :class:`ToolCallAssembler` (each one exists because a real server needs it):

* fragments are keyed by ``index``; a fragment without ``index`` continues the latest call
  unless it clearly starts a new one (a name for a call that already has a name, with a
  different id or, without ids, after the previous arguments already form complete JSON),
  in which case it takes the next slot;
* an ``index`` that is reused by a fragment carrying a name **and** a non-empty id different
  from the slot's starts a new slot (servers that send every call as index 0);
* ``id``, ``type`` and ``name`` are assigned once and never concatenated (servers that repeat
  them on every chunk; nameless continuation fragments that carry a fresh id each time);
* ``arguments`` are concatenated; ``""`` means ``{}``; ``{...}{...}`` is split into separate
  calls; arguments that arrive as an object (not a string) are accepted; a JSON string that
  itself holds a JSON object is unwrapped.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import string
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

_ALNUM = string.ascii_letters + string.digits


def new_call_id() -> str:
    """A tool-call id: 9 alphanumerics (the form Mistral templates insist on)."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


# ---------------------------------------------------------------- SSE


async def sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """Yield the ``data`` payload of each server-sent event.

    Tolerates servers that omit the blank line between events (a new ``data:`` line after a
    payload that is already complete JSON starts a new event) and ``data:`` without a space.
    """
    buf: list[str] = []
    async for raw in lines:
        line = raw.rstrip("\r")
        if line.startswith("data:"):
            if buf and _complete_json("\n".join(buf)):
                yield "\n".join(buf)
                buf = []
            buf.append(line[5:].removeprefix(" "))
        elif not line and buf:
            yield "\n".join(buf)
            buf = []
        # comments (":..."), event:, id:, retry: and anything else are ignored
    if buf:
        yield "\n".join(buf)


# ---------------------------------------------------------------- tool calls


@dataclass
class ToolCallRequest:
    """One tool call the model asked for, fully assembled."""

    id: str
    name: str
    arguments: dict[str, Any] | None  # None when the arguments could not be parsed
    raw_arguments: str = ""
    parse_error: str | None = None
    source: str = "tool_calls"  # or "text" when parsed out of the content

    def openai(self) -> dict[str, Any]:
        """The entry for the assistant message's ``tool_calls`` (always valid JSON)."""
        args = self.arguments if self.arguments is not None else {}
        return {"id": self.id, "type": "function",
                "function": {"name": self.name,
                             "arguments": json.dumps(args, ensure_ascii=False)}}


@dataclass
class _Slot:
    key: Any
    id: str | None = None
    type: str | None = None
    name: str | None = None
    parts: list[str] = field(default_factory=list)

    @property
    def raw(self) -> str:
        return "".join(self.parts)

    def assign_once(self, fid: Any, kind: Any, name: Any) -> bool:
        """Set id, type and name the first time each arrives; True when the name just did."""
        if fid and self.id is None:
            self.id = str(fid)
        if kind and self.type is None:
            self.type = str(kind)
        if not name or self.name is not None:
            return False
        self.name = str(name)
        return True


def _complete_json(text: str) -> bool:
    text = text.strip()
    if not text:
        return False
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class ToolCallAssembler:
    """Accumulate streamed ``delta.tool_calls`` fragments into complete calls."""

    def __init__(self) -> None:
        self.slots: list[_Slot] = []
        self._by_index: dict[Any, _Slot] = {}

    def _new(self, key: Any) -> _Slot:
        slot = _Slot(key=key)
        self.slots.append(slot)
        if key is not None:
            self._by_index[key] = slot
        return slot

    def _current(self, index: Any) -> _Slot | None:
        """The slot a fragment continues: its index's, or the latest without one."""
        if index is not None:
            return self._by_index.get(index)
        return self.slots[-1] if self.slots else None

    def feed(self, fragment: dict[str, Any]) -> tuple[int, bool, bool]:
        """Add one fragment; return (slot position, slot just created, name just received)."""
        index = fragment.get("index")
        fid = fragment.get("id") or None
        fn = fragment.get("function") or {}
        name = fn.get("name") or None
        slot = self._current(index)
        created = slot is None or _starts_new_call(slot, index, fid, name)
        if slot is None or created:
            slot = self._new(index)
        named = slot.assign_once(fid, fragment.get("type"), name)
        slot.parts.extend(_argument_text(fn.get("arguments")))
        return self.slots.index(slot), created, named

    def finish(self, truncated: bool = False) -> list[ToolCallRequest]:
        """The assembled calls, in order. ``truncated``: the stream ended on the length limit."""
        calls: list[ToolCallRequest] = []
        for slot in self.slots:
            calls.extend(split_arguments(slot.id, slot.name or "", slot.raw, truncated))
        return unique_ids(calls)


def _starts_new_call(slot: _Slot, index: Any, fid: str | None, name: str | None) -> bool:
    """Whether a named fragment opens a new call instead of continuing ``slot`` (module rules)."""
    if not name:
        return False
    if index is not None:
        return bool(fid and slot.id and fid != slot.id)
    if slot.name is None:
        return False
    if fid and slot.id:
        return fid != slot.id
    return name != slot.name or _complete_json(slot.raw)


def _argument_text(args: Any) -> list[str]:
    """A fragment's ``arguments`` as text to append (an object is re-encoded; else nothing)."""
    if isinstance(args, str):
        return [args]
    if isinstance(args, dict | list):
        return [json.dumps(args, ensure_ascii=False)]
    return []


def unique_ids(calls: list[ToolCallRequest]) -> list[ToolCallRequest]:
    """Give every call a distinct, non-empty id (generating where needed)."""
    seen: set[str] = set()
    for call in calls:
        if not call.id or call.id in seen:
            call.id = new_call_id()
        seen.add(call.id)
    return calls


def _decode_one(text: str) -> Any:
    value = json.loads(text)
    if isinstance(value, str):  # double-encoded arguments
        stripped = value.strip()
        if stripped.startswith("{"):
            return json.loads(stripped)
    return value


def _skip_separators(text: str, pos: int) -> int:
    """The first position at or after ``pos`` that is not whitespace, ``,`` or ``;``."""
    while pos < len(text) and text[pos] in " \t\r\n,;":
        pos += 1
    return pos


def split_arguments(call_id: str | None, name: str, raw: str,
                    truncated: bool = False) -> list[ToolCallRequest]:
    """Parse one slot's argument text into one or more calls (``}{`` splits)."""
    text = raw.strip()
    first_id = call_id or ""  # the first call's id ("": unique_ids gives it one)
    if not text:
        return [ToolCallRequest(first_id, name, {}, raw)]
    decoder = json.JSONDecoder()
    out: list[ToolCallRequest] = []
    pos = _skip_separators(text, 0)
    while pos < len(text):
        call_id = first_id if not out else ""
        try:
            value, end = decoder.raw_decode(text, pos)
        except ValueError as exc:
            why = _undecodable_reason(exc, pos, truncated)
            out.append(ToolCallRequest(call_id, name, None, text[pos:], why))
            break
        out.append(_decoded_call(call_id, name, value, text[pos:end]))
        pos = _skip_separators(text, end)
    return out


def _undecodable_reason(exc: ValueError, pos: int, truncated: bool) -> str:
    """Why arguments starting at ``pos`` did not decode, for the model to read."""
    if truncated:
        return "the reply hit the length limit before the arguments were complete"
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at character {exc.pos - pos}"
    return str(exc)  # a plain ValueError (an integer of over 4300 digits) has no position


def _decoded_call(call_id: str, name: str, value: Any, piece: str) -> ToolCallRequest:
    """The call of one decoded argument value (a JSON string holding an object is unwrapped)."""
    if isinstance(value, str) and value.strip().startswith("{"):
        with contextlib.suppress(ValueError):
            value = json.loads(value)
    if isinstance(value, dict):
        return ToolCallRequest(call_id, name, value, piece)
    why = f"arguments must be a JSON object, got {type(value).__name__}"
    return ToolCallRequest(call_id, name, None, piece, why)


# ---------------------------------------------------------------- <think> in content


class ThinkSplitter:
    """Split streamed content into (is_reasoning, text) pieces around ``<think>…</think>``.

    Holds back a trailing partial tag so that a tag split over two chunks is still seen. A
    stray ``</think>`` (its opening tag was in the prompt) is dropped.
    """

    OPEN, CLOSE = "<think>", "</think>"

    def __init__(self) -> None:
        self.inside = False
        self._pending = ""

    def feed(self, text: str) -> list[tuple[bool, str]]:
        data = self._pending + text
        self._pending = ""
        out: list[tuple[bool, str]] = []
        while data:
            tags = self._tags()
            hit = _first_tag(data, tags)
            if hit is not None:
                i, tag = hit
                if i:
                    out.append((self.inside, data[:i]))
                data = data[i + len(tag):]
                self.inside = tag == self.OPEN
                continue
            keep = _partial_tag_length(data, tags)
            if keep:
                self._pending = data[-keep:]
                data = data[:-keep]
            if data:
                out.append((self.inside, data))
            break
        return out

    def _tags(self) -> list[str]:
        """The tags that mean something now: inside reasoning only its end."""
        return [self.CLOSE] if self.inside else [self.OPEN, self.CLOSE]

    def flush(self) -> list[tuple[bool, str]]:
        """Whatever was held back at the end of the stream."""
        data, self._pending = self._pending, ""
        return [(self.inside, data)] if data else []


def _first_tag(data: str, tags: list[str]) -> tuple[int, str] | None:
    """(position, tag) of the earliest of ``tags`` in ``data``; None when there is none."""
    hits = [(data.find(t), t) for t in tags if data.find(t) >= 0]
    return min(hits) if hits else None


def _partial_tag_length(data: str, tags: list[str]) -> int:
    """Length of the longest tail of ``data`` that could be the start of one of ``tags``."""
    longest = min(max(len(t) for t in tags), len(data))
    return next((k for k in range(longest, 0, -1) if any(t.startswith(data[-k:]) for t in tags)),
                0)


def split_think(text: str) -> tuple[str, str]:
    """(visible text, reasoning) of a whole reply with ``<think>`` blocks in its content.

    A ``</think>`` before any ``<think>`` closes reasoning whose opening tag was part of the
    prompt (some Qwen3 / DeepSeek-R1 templates): everything before it is reasoning.
    """
    reasoning: list[str] = []
    close, open_ = text.find("</think>"), text.find("<think>")
    if close >= 0 and (open_ < 0 or close < open_):
        reasoning.append(text[:close])
        text = text[close + len("</think>"):]

    def keep(m: re.Match[str]) -> str:
        reasoning.append(m.group(1))
        return ""

    text = re.sub(r"<think>(.*?)(?:</think>|$)", keep, text, flags=re.DOTALL)
    return text.strip(), "".join(reasoning)


def strip_think(text: str) -> str:
    """``text`` without ``<think>…</think>`` blocks (an unclosed one runs to the end)."""
    text = re.sub(r"<think>.*?(</think>|$)", "", text, flags=re.DOTALL)
    if "</think>" in text:
        text = text.split("</think>", 1)[1]
    return text.strip()


# ---------------------------------------------------------------- tool calls in the text


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_LLAMA_TAG = "<|python_tag|>"
_MISTRAL_TAG = "[TOOL_CALLS]"
_MISTRAL_NAMED = re.compile(r"\s*([A-Za-z0-9_.-]+)(?:\[CALL_ID\]([A-Za-z0-9_-]+))?\[ARGS\]")
_SPECIAL_TOKENS = re.compile(r"<\|(?:eom_id|eot_id|im_end|end)\|>|</s>")


def _json_values(text: str) -> list[Any]:
    """Every JSON value in ``text`` (objects or arrays), separated by whitespace, ``;`` or ``,``."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    text = text.strip()
    pos = _skip_separators(text, 0)
    while pos < len(text):
        try:
            value, pos = decoder.raw_decode(text, pos)
        except ValueError:
            break
        values.append(value)
        pos = _skip_separators(text, pos)
    return values


def _as_calls(values: Iterable[Any], known: set[str]) -> list[tuple[str, Any]]:
    items = [item for value in values for item in (value if isinstance(value, list) else [value])]
    return [call for call in map(_call_of, items) if call is not None and call[0] in known]


def _call_of(item: Any) -> tuple[str, Any] | None:
    """(name, arguments) of a call object (OpenAI's ``{"function": {...}}`` or a bare
    ``{"name", "arguments"/"parameters"}``); None for anything else."""
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("function"), dict):
        item = item["function"]
    name = item.get("name")
    if not isinstance(name, str):
        return None
    return name, item.get("arguments", item.get("parameters", {}))


_Found = tuple[list[tuple[str, Any]], str]  # ((name, arguments) calls, the text without them)


def _hermes_calls(text: str, known: set[str]) -> _Found:
    """Hermes/Qwen ``<tool_call>{…}</tool_call>`` blocks."""
    found = [call for block in _HERMES.finditer(text)
             for call in _as_calls(_json_values(block.group(1)), known)]
    return found, _HERMES.sub("", text) if found else text


def _llama_calls(text: str, known: set[str]) -> _Found:
    """Llama 3 ``<|python_tag|>{…}``: the calls follow the tag."""
    before, after = text.split(_LLAMA_TAG, 1)
    found = _as_calls(_json_values(_SPECIAL_TOKENS.sub("", after)), known)
    return found, before if found else text


def _mistral_calls(text: str, known: set[str]) -> _Found:
    """Mistral ``[TOOL_CALLS][…]`` lists and ``[TOOL_CALLS]name[ARGS]{…}`` segments."""
    before, after = text.split(_MISTRAL_TAG, 1)
    found: list[tuple[str, Any]] = []
    for segment in _SPECIAL_TOKENS.sub("", after).split(_MISTRAL_TAG):
        seg = segment.strip()
        if seg.startswith(("[", "{")):
            found.extend(_as_calls(_json_values(seg), known))
        else:
            found.extend(_mistral_named_calls(seg, known))
    return found, before if found else text


def _mistral_named_calls(seg: str, known: set[str]) -> list[tuple[str, Any]]:
    """The ``name[CALL_ID]id[ARGS]{…}`` calls at the start of ``seg``, until one fails."""
    decoder = json.JSONDecoder()
    found: list[tuple[str, Any]] = []
    pos = 0
    while m := _MISTRAL_NAMED.match(seg, pos):
        try:
            args, pos = decoder.raw_decode(seg, m.end())
        except ValueError:
            break
        if m.group(1) in known:
            found.append((m.group(1), args))
    return found


def _bare_json_calls(text: str, known: set[str]) -> _Found:
    """A reply that is nothing but call objects (Llama 3.x JSON tool calling)."""
    stripped = _SPECIAL_TOKENS.sub("", text).strip()
    if not stripped.startswith(("{", "[")):
        return [], text
    values = _json_values(stripped)
    calls = _as_calls(values, known)
    if calls and len(calls) == sum(len(v) if isinstance(v, list) else 1 for v in values):
        return calls, ""
    return [], text


# the first marker present picks the format; no marker: a bare JSON reply
_TEXT_CALL_FORMATS = (("<tool_call>", _hermes_calls), (_LLAMA_TAG, _llama_calls),
                      (_MISTRAL_TAG, _mistral_calls))


def parse_text_tool_calls(content: str, known: set[str]) -> tuple[list[ToolCallRequest], str]:
    """Tool calls a model wrote into its text; returns (calls, the text without them).

    Recognises Hermes/Qwen ``<tool_call>{…}</tool_call>``, Llama 3 ``<|python_tag|>{…}`` (and a
    bare JSON call object as the whole reply), and Mistral ``[TOOL_CALLS][…]`` /
    ``[TOOL_CALLS]name[ARGS]{…}``. ``<think>`` blocks are skipped. Only names in ``known``
    are accepted; anything else stays text.
    """
    text = strip_think(content)
    parse = next((p for marker, p in _TEXT_CALL_FORMATS if marker in text), _bare_json_calls)
    found, rest = parse(text, known)
    requests: list[ToolCallRequest] = []
    for name, args in found:
        raw = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        for call in split_arguments(None, name, raw):
            call.source = "text"
            requests.append(call)
    return unique_ids(requests), rest.strip()
