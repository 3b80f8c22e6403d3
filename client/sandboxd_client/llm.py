"""The LLM side of the agent: one streamed ``/chat/completions`` request to an
OpenAI-compatible server (SSE, or one JSON body from a server that ignores ``stream``), read
into a :class:`Turn`: the answer, the model's reasoning, the tool calls, usage. Also the
trimming of the history to the context window."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import httpx

from sandboxd_client.records import Fragment, LLMError, Message, ToolCallEvent, maybe_await
from sandboxd_client.stream import (
    ThinkSplitter,
    ToolCallAssembler,
    ToolCallRequest,
    split_think,
    sse_data,
)


class LLMSettings(Protocol):
    """What a request is built from (an :class:`~sandboxd_client.Agent` is one). ``complete``
    updates ``stream_usage`` (off for a server that refuses it) and ``chars_per_token``
    (calibrated from the server's ``usage.prompt_tokens``)."""

    base_url: str
    model: str
    temperature: float | None
    max_tokens: int | None
    context_tokens: int | None
    extra_body: dict[str, Any]
    stream_usage: bool
    chars_per_token: float


@dataclass
class Turn:
    """One reply of the model, as the stream delivered it."""

    content: str = ""
    reasoning: str = ""
    calls: list[ToolCallRequest] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None


_PLACEHOLDER = "[older tool result removed to fit the context window]"


def fit(cfg: LLMSettings, messages: list[Message], tools: list[dict[str, Any]]) -> list[Message]:
    """The history to send, trimmed to ``cfg.context_tokens`` (the context budget).

    Never touched: system messages, the last user message, and the latest assistant
    message with everything after it. First the oldest tool results are emptied, then the
    oldest exchanges are dropped whole (an assistant message with its tool results).
    """
    if not cfg.context_tokens:
        return messages
    budget = max(1, cfg.context_tokens - (cfg.max_tokens or 1024))

    def over_budget(msgs: list[Message]) -> bool:
        """Whether ``msgs`` exceed the context budget."""
        return _sent_chars(msgs, tools) / cfg.chars_per_token > budget

    if not over_budget(messages):
        return messages
    out = [dict(m) for m in messages]
    _empty_old_tool_results(out, over_budget)
    while over_budget(out) and _drop_oldest_exchange(out):
        pass
    return out


def _empty_old_tool_results(out: list[Message],
                            over_budget: Callable[[list[Message]], bool]) -> None:
    """Replace unprotected tool results by a placeholder, oldest first, until within budget."""
    keep = _protected(out)
    for i, m in enumerate(out):
        if not over_budget(out):
            return
        if i not in keep and m.get("role") == "tool" and m.get("content") != _PLACEHOLDER:
            m["content"] = _PLACEHOLDER


def _sent_chars(messages: list[Message], tools: list[dict[str, Any]]) -> int:
    """Characters of the JSON the request carries for ``messages`` and ``tools``."""
    return sum(len(json.dumps(m, ensure_ascii=False)) for m in messages) + (
        len(json.dumps(tools)) if tools else 0)


def _protected(msgs: list[Message]) -> set[int]:
    """Positions :func:`fit` never touches: system, last user, latest assistant onwards."""
    keep = {i for i, m in enumerate(msgs) if m.get("role") == "system"}
    users = [i for i, m in enumerate(msgs) if m.get("role") == "user"]
    assistants = [i for i, m in enumerate(msgs) if m.get("role") == "assistant"]
    keep.update(users[-1:])
    keep.update(range(assistants[-1], len(msgs)) if assistants else ())
    return keep


def _drop_oldest_exchange(out: list[Message]) -> bool:
    """Delete the oldest unprotected message with its tool results; False if none can go."""
    keep = _protected(out)
    start = next((i for i, m in enumerate(out) if i not in keep and m.get("role") != "tool"),
                 None)
    if start is None:
        return False
    end = _exchange_end(out, start)
    if any(i in keep for i in range(start, end)):
        return False
    del out[start:end]
    return True


def _exchange_end(out: list[Message], start: int) -> int:
    """Where the exchange at ``start`` ends: after an assistant's tool calls, their results."""
    end = start + 1
    if out[start].get("tool_calls"):
        while end < len(out) and out[end].get("role") == "tool":
            end += 1
    return end


def _request_body(cfg: LLMSettings, sent: list[Message],
                  tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``/chat/completions`` body; ``extra_body`` overrides everything else."""
    optional = {
        "tools": tools or None,
        "tool_choice": "auto" if tools else None,
        "stream_options": {"include_usage": True} if cfg.stream_usage else None,
        "temperature": cfg.temperature,
        "max_tokens": cfg.max_tokens,
    }
    body: dict[str, Any] = {"model": cfg.model, "messages": sent, "stream": True}
    body.update({k: v for k, v in optional.items() if v is not None})
    body.update(cfg.extra_body)
    return body


async def complete(cfg: LLMSettings, http: httpx.AsyncClient, messages: list[Message],
                   tools: list[dict[str, Any]], round_index: int,
                   emit_fragment: Callable[[Fragment], Awaitable[None]],
                   on_event: Callable[[ToolCallEvent], Any] | None = None) -> Turn:
    """One round: the request (history fitted to the context, ``tools`` offered if any),
    streamed; retried once without ``stream_options`` for a server that refuses it."""
    sent = fit(cfg, messages, tools)
    body = _request_body(cfg, sent, tools)
    sent_chars = _sent_chars(sent, tools)
    url = f"{cfg.base_url}/chat/completions"
    try:
        turn = await stream(http, url, body, round_index, emit_fragment, on_event)
    except LLMError as exc:
        if not (exc.status == 400 and "stream_options" in exc.body and "stream_options" in body):
            raise
        # an older server that rejects stream_options: ask again without it
        cfg.stream_usage = False
        body.pop("stream_options")
        turn = await stream(http, url, body, round_index, emit_fragment, on_event)
    _calibrate(cfg, turn.usage, sent_chars)
    return turn


def _calibrate(cfg: LLMSettings, usage: dict[str, Any] | None, sent_chars: int) -> None:
    """Learn the characters per token from the server's count of the prompt (1 to 8)."""
    prompt_tokens = (usage or {}).get("prompt_tokens")
    if isinstance(prompt_tokens, int) and prompt_tokens > 0:
        cfg.chars_per_token = min(8.0, max(1.0, sent_chars / prompt_tokens))


async def stream(http: httpx.AsyncClient, url: str, body: dict[str, Any],
                 round_index: int,
                 emit_fragment: Callable[[Fragment], Awaitable[None]],
                 on_event: Callable[[ToolCallEvent], Any] | None = None) -> Turn:
    """POST ``body`` to ``url`` and read the reply, reporting text pieces to
    ``emit_fragment`` and tool-call progress to ``on_event`` as they arrive."""
    reader = _TurnReader(round_index, emit_fragment, on_event)
    try:
        async with http.stream("POST", url, json=body) as response:
            if response.status_code >= 400:
                raw = (await response.aread()).decode(errors="replace")
                raise LLMError(f"LLM server answered {response.status_code}: {raw[:500]}",
                               response.status_code, raw)
            await reader.read(response)
    except httpx.HTTPError as exc:
        raise LLMError(f"LLM server at {url} failed: {exc}") from exc
    return await reader.finish()


def _event_text(args: Any) -> str:
    """A fragment's arguments as the text of an ``arguments`` event ("" for none)."""
    if isinstance(args, dict | list):
        return json.dumps(args, ensure_ascii=False)
    return args if isinstance(args, str) else ""


def _content_text(content: Any) -> str:
    """A delta's ``content``: a string, or the texts of a list of content parts."""
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return _text_of(content)


def _text_of(value: Any) -> str:
    """``value`` when it is a string, else ""."""
    return value if isinstance(value, str) else ""


def _stream_error(chunk: dict[str, Any]) -> LLMError:
    """The error an ``{"error": ...}`` chunk reports."""
    err = chunk["error"]
    detail = err.get("message") if isinstance(err, dict) else str(err)
    return LLMError(f"LLM server error in stream: {detail}", None, json.dumps(chunk))


_EventKind = Literal["started", "name", "arguments", "ended", "failed"]


def _call_fragments(delta: dict[str, Any], full: bool) -> list[dict[str, Any]]:
    """A delta's tool-call fragments (a whole message's calls get their position as index)."""
    calls = delta.get("tool_calls")
    if calls:
        return [{"index": i, **frag} if full else frag
                for i, frag in enumerate(calls) if isinstance(frag, dict)]
    legacy = delta.get("function_call")  # the pre-tools OpenAI shape (old servers)
    return [{"index": "function_call", "function": legacy}] if isinstance(legacy, dict) else []


class _TurnReader:
    """Turns the chunks of one reply into a :class:`Turn`, reporting progress as it goes."""

    def __init__(self, round_index: int, emit_fragment: Callable[[Fragment], Awaitable[None]],
                 on_event: Callable[[ToolCallEvent], Any] | None) -> None:
        self.turn = Turn()
        self.assembler = ToolCallAssembler()
        self.think = ThinkSplitter()  # classifies streamed pieces for on_fragment only
        self.raw_content: list[str] = []
        self.reasoning: list[str] = []
        self.round_index = round_index
        self.emit_fragment = emit_fragment
        self.on_event = on_event

    async def read(self, response: httpx.Response) -> None:
        """Every chunk of ``response``: SSE events, or one JSON body (``stream`` ignored)."""
        ctype = response.headers.get("content-type", "")
        if "text/event-stream" not in ctype and "json" in ctype:
            await self.chunk(json.loads(await response.aread()), full=True)
            return
        async for data in sse_data(response.aiter_lines()):
            if data.strip() == "[DONE]":
                break
            try:
                chunk = json.loads(data)
            except ValueError as exc:
                raise LLMError(f"LLM server sent a malformed event: {data[:200]}",
                               None, data) from exc
            await self.chunk(chunk, full=False)

    async def chunk(self, chunk: Any, full: bool) -> None:
        """One chunk (``full``: a whole response, whose choices carry ``message``)."""
        if not isinstance(chunk, dict):
            return
        if chunk.get("error"):
            raise _stream_error(chunk)
        if isinstance(chunk.get("usage"), dict):
            self.turn.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) == 0:
                await self._choice(choice, full)

    async def _choice(self, choice: dict[str, Any], full: bool) -> None:
        """One choice of a chunk: its reasoning, text, call fragments and finish reason."""
        delta = (choice.get("message") if full else choice.get("delta")) or {}
        r = _text_of(delta.get("reasoning_content") or delta.get("reasoning"))
        if r:
            self.reasoning.append(r)
            await self._text(r, True)
        c = _content_text(delta.get("content"))
        if c:
            await self._content(c)
        for frag in _call_fragments(delta, full):
            await self._call_fragment(frag)
        if choice.get("finish_reason"):
            self.turn.finish_reason = choice["finish_reason"]

    async def _text(self, piece: str, is_reasoning: bool) -> None:
        """Report a piece of text (reasoning or not) to the caller."""
        await self.emit_fragment(Fragment(piece, is_reasoning, self.round_index))

    async def _content(self, piece: str) -> None:
        """Keep a piece of content and report it, split around ``<think>`` tags."""
        self.raw_content.append(piece)
        for is_reasoning, part in self.think.feed(piece):
            await self._text(part, is_reasoning)

    async def _event(self, kind: _EventKind, index: int, name: str | None = None,
                     text: str = "") -> None:
        """Report a tool call's progress, when someone listens."""
        if self.on_event is not None:
            await maybe_await(self.on_event(ToolCallEvent(kind, index, self.round_index, name,
                                                          text)))

    async def _call_fragment(self, frag: dict[str, Any]) -> None:
        """Feed a tool-call fragment to the assembler and report what it started or added."""
        index, created, named = self.assembler.feed(frag)
        slot = self.assembler.slots[index]
        if created:
            await self._event("started", index)
        if named:
            await self._event("name", index, slot.name, slot.name or "")
        args = _event_text((frag.get("function") or {}).get("arguments"))
        if args:
            await self._event("arguments", index, slot.name, args)

    async def finish(self) -> Turn:
        """The turn, once the stream ended: held-back text out, calls assembled and reported."""
        for is_reasoning, piece in self.think.flush():
            await self._text(piece, is_reasoning)
        turn = self.turn
        turn.content, in_content = split_think("".join(self.raw_content))
        turn.reasoning = "".join(self.reasoning) + in_content
        turn.calls = self.assembler.finish(truncated=turn.finish_reason == "length")
        for i, call in enumerate(turn.calls):
            kind: _EventKind = "ended" if call.parse_error is None else "failed"
            detail = call.raw_arguments if call.parse_error is None else call.parse_error
            await self._event(kind, i, call.name, detail)
        return turn
