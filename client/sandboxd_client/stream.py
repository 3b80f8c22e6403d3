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

    def complete() -> bool:
        try:
            json.loads("\n".join(buf))
        except ValueError:
            return False
        return True

    async for raw in lines:
        line = raw.rstrip("\r")
        if not line:
            if buf:
                yield "\n".join(buf)
                buf = []
            continue
        if line.startswith(":"):
            continue
        if line.startswith("data:"):
            payload = line[5:]
            if payload.startswith(" "):
                payload = payload[1:]
            if buf and complete():
                yield "\n".join(buf)
                buf = []
            buf.append(payload)
        # event:, id:, retry: and anything else are ignored
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

    def feed(self, fragment: dict[str, Any]) -> tuple[int, bool, bool]:
        """Add one fragment; return (slot position, slot just created, name just received)."""
        index = fragment.get("index")
        fid = fragment.get("id") or None
        fn = fragment.get("function") or {}
        name = fn.get("name") or None
        args = fn.get("arguments")
        created = False
        if index is not None:
            slot = self._by_index.get(index)
            if slot is None or (name and fid and slot.id and fid != slot.id):
                slot, created = self._new(index), True
        else:
            slot = self.slots[-1] if self.slots else None
            if slot is None:
                slot, created = self._new(None), True
            elif name and slot.name is not None:
                if fid and slot.id:
                    starts_new = fid != slot.id
                else:
                    starts_new = name != slot.name or _complete_json(slot.raw)
                if starts_new:
                    slot, created = self._new(None), True
        if fid and slot.id is None:
            slot.id = str(fid)
        if fragment.get("type") and slot.type is None:
            slot.type = str(fragment["type"])
        named = False
        if name and slot.name is None:
            slot.name = str(name)
            named = True
        if isinstance(args, str):
            slot.parts.append(args)
        elif isinstance(args, dict | list):
            slot.parts.append(json.dumps(args, ensure_ascii=False))
        return self.slots.index(slot), created, named

    def finish(self, truncated: bool = False) -> list[ToolCallRequest]:
        """The assembled calls, in order. ``truncated``: the stream ended on the length limit."""
        calls: list[ToolCallRequest] = []
        for slot in self.slots:
            calls.extend(split_arguments(slot.id, slot.name or "", slot.raw, truncated))
        return unique_ids(calls)


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


def split_arguments(call_id: str | None, name: str, raw: str,
                    truncated: bool = False) -> list[ToolCallRequest]:
    """Parse one slot's argument text into one or more calls (``}{`` splits)."""
    text = raw.strip()
    first_id = call_id or ""  # the first call's id ("": unique_ids gives it one)
    if not text:
        return [ToolCallRequest(first_id, name, {}, raw)]
    decoder = json.JSONDecoder()
    out: list[ToolCallRequest] = []
    pos = 0
    while pos < len(text):
        while pos < len(text) and text[pos] in " \t\r\n,;":
            pos += 1
        if pos >= len(text):
            break
        try:
            value, end = decoder.raw_decode(text, pos)
        except ValueError as exc:
            rest = text[pos:]
            # a plain ValueError (an integer of over 4300 digits) has no position
            why = ("the reply hit the length limit before the arguments were complete"
                   if truncated else f"{exc.msg} at character {exc.pos - pos}"
                   if isinstance(exc, json.JSONDecodeError) else str(exc))
            out.append(ToolCallRequest(first_id if not out else "", name, None, rest, why))
            break
        piece = text[pos:end]
        if isinstance(value, str) and value.strip().startswith("{"):
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        if isinstance(value, dict):
            out.append(ToolCallRequest(first_id if not out else "", name, value, piece))
        else:
            why = f"arguments must be a JSON object, got {type(value).__name__}"
            out.append(ToolCallRequest(first_id if not out else "", name, None, piece, why))
        pos = end
    return out


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
            tags = [self.CLOSE] if self.inside else [self.OPEN, self.CLOSE]
            hits = [(data.find(t), t) for t in tags if data.find(t) >= 0]
            if hits:
                i, tag = min(hits)
                if i:
                    out.append((self.inside, data[:i]))
                data = data[i + len(tag):]
                self.inside = tag == self.OPEN
                continue
            keep = 0
            for k in range(min(len(self.CLOSE), len(data)), 0, -1):
                if any(t.startswith(data[-k:]) for t in tags):
                    keep = k
                    break
            if keep:
                self._pending = data[-keep:]
                data = data[:-keep]
            if data:
                out.append((self.inside, data))
            break
        return out

    def flush(self) -> list[tuple[bool, str]]:
        """Whatever was held back at the end of the stream."""
        data, self._pending = self._pending, ""
        return [(self.inside, data)] if data else []


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
    pos = 0
    text = text.strip()
    while pos < len(text):
        while pos < len(text) and text[pos] in " \t\r\n;,":
            pos += 1
        if pos >= len(text):
            break
        try:
            value, pos = decoder.raw_decode(text, pos)
        except ValueError:
            break
        values.append(value)
    return values


def _as_calls(values: Iterable[Any], known: set[str]) -> list[tuple[str, Any]]:
    calls: list[tuple[str, Any]] = []
    for value in values:
        items = value if isinstance(value, list) else [value]
        for item in items:
            if not isinstance(item, dict):
                continue
            if "function" in item and isinstance(item["function"], dict):
                item = item["function"]
            name = item.get("name")
            if not isinstance(name, str) or name not in known:
                continue
            args = item.get("arguments", item.get("parameters", {}))
            calls.append((name, args))
    return calls


def parse_text_tool_calls(content: str, known: set[str]) -> tuple[list[ToolCallRequest], str]:
    """Tool calls a model wrote into its text; returns (calls, the text without them).

    Recognises Hermes/Qwen ``<tool_call>{…}</tool_call>``, Llama 3 ``<|python_tag|>{…}`` (and a
    bare JSON call object as the whole reply), and Mistral ``[TOOL_CALLS][…]`` /
    ``[TOOL_CALLS]name[ARGS]{…}``. ``<think>`` blocks are skipped. Only names in ``known``
    are accepted; anything else stays text.
    """
    text = strip_think(content)
    found: list[tuple[str, Any]] = []
    rest = text
    if "<tool_call>" in text:
        for block in _HERMES.finditer(text):
            found.extend(_as_calls(_json_values(block.group(1)), known))
        if found:
            rest = _HERMES.sub("", text)
    elif _LLAMA_TAG in text:
        before, after = text.split(_LLAMA_TAG, 1)
        found = _as_calls(_json_values(_SPECIAL_TOKENS.sub("", after)), known)
        if found:
            rest = before
    elif _MISTRAL_TAG in text:
        before, after = text.split(_MISTRAL_TAG, 1)
        after = _SPECIAL_TOKENS.sub("", after)
        segments = after.split(_MISTRAL_TAG)
        for segment in segments:
            seg = segment.strip()
            if seg.startswith(("[", "{")):
                found.extend(_as_calls(_json_values(seg), known))
                continue
            decoder = json.JSONDecoder()
            pos = 0
            while True:
                m = _MISTRAL_NAMED.match(seg, pos)
                if not m:
                    break
                try:
                    args, pos = decoder.raw_decode(seg, m.end())
                except ValueError:
                    break
                if m.group(1) in known:
                    found.append((m.group(1), args))
        if found:
            rest = before
    else:
        stripped = _SPECIAL_TOKENS.sub("", text).strip()
        if stripped.startswith(("{", "[")):
            values = _json_values(stripped)
            calls = _as_calls(values, known)
            # only when the whole reply is call objects (Llama 3.x JSON tool calling)
            if calls and len(calls) == sum(len(v) if isinstance(v, list) else 1 for v in values):
                found, rest = calls, ""
    requests: list[ToolCallRequest] = []
    for name, args in found:
        raw = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        for call in split_arguments(None, name, raw):
            call.source = "text"
            requests.append(call)
    return unique_ids(requests), rest.strip()
