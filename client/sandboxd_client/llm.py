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


def fit(cfg: LLMSettings, messages: list[Message], tools: list[dict[str, Any]]) -> list[Message]:
    """The history to send, trimmed to ``cfg.context_tokens`` (the context budget).

    Never touched: system messages, the last user message, and the latest assistant
    message with everything after it. First the oldest tool results are emptied, then the
    oldest exchanges are dropped whole (an assistant message with its tool results).
    """
    if not cfg.context_tokens:
        return messages
    reserve = cfg.max_tokens or 1024
    budget = max(1, cfg.context_tokens - reserve)
    tools_chars = len(json.dumps(tools)) if tools else 0

    def tokens(msgs: list[Message]) -> float:
        chars = sum(len(json.dumps(m, ensure_ascii=False)) for m in msgs) + tools_chars
        return chars / cfg.chars_per_token

    if tokens(messages) <= budget:
        return messages
    out = [dict(m) for m in messages]

    def protected(msgs: list[Message]) -> set[int]:
        keep = {i for i, m in enumerate(msgs) if m.get("role") == "system"}
        users = [i for i, m in enumerate(msgs) if m.get("role") == "user"]
        if users:
            keep.add(users[-1])
        assistants = [i for i, m in enumerate(msgs) if m.get("role") == "assistant"]
        if assistants:
            keep.update(range(assistants[-1], len(msgs)))
        return keep

    placeholder = "[older tool result removed to fit the context window]"
    keep = protected(out)
    for i, m in enumerate(out):
        if tokens(out) <= budget:
            break
        if i not in keep and m.get("role") == "tool" and m.get("content") != placeholder:
            m["content"] = placeholder
    while tokens(out) > budget:
        keep = protected(out)
        start = next((i for i, m in enumerate(out)
                      if i not in keep and m.get("role") != "tool"), None)
        if start is None:
            break
        end = start + 1
        if out[start].get("tool_calls"):
            while end < len(out) and out[end].get("role") == "tool":
                end += 1
        if any(i in keep for i in range(start, end)):
            break
        del out[start:end]
    return out


async def complete(cfg: LLMSettings, http: httpx.AsyncClient, messages: list[Message],
                   tools: list[dict[str, Any]], round_index: int,
                   emit_fragment: Callable[[Fragment], Awaitable[None]],
                   on_event: Callable[[ToolCallEvent], Any] | None = None) -> Turn:
    """One round: the request (history fitted to the context, ``tools`` offered if any),
    streamed; retried once without ``stream_options`` for a server that refuses it."""
    sent = fit(cfg, messages, tools)
    body: dict[str, Any] = {"model": cfg.model, "messages": sent, "stream": True}
    if tools:
        body["tools"] = tools
        body["tool_choice"] = "auto"
    if cfg.stream_usage:
        body["stream_options"] = {"include_usage": True}
    if cfg.temperature is not None:
        body["temperature"] = cfg.temperature
    if cfg.max_tokens is not None:
        body["max_tokens"] = cfg.max_tokens
    body.update(cfg.extra_body)
    sent_chars = sum(len(json.dumps(m, ensure_ascii=False)) for m in sent) + (
        len(json.dumps(tools)) if tools else 0)
    url = f"{cfg.base_url}/chat/completions"
    try:
        turn = await stream(http, url, body, round_index, emit_fragment, on_event)
    except LLMError as exc:
        if exc.status == 400 and "stream_options" in exc.body and "stream_options" in body:
            # an older server that rejects stream_options: ask again without it
            cfg.stream_usage = False
            body.pop("stream_options")
            turn = await stream(http, url, body, round_index, emit_fragment, on_event)
        else:
            raise
    prompt_tokens = (turn.usage or {}).get("prompt_tokens")
    if isinstance(prompt_tokens, int) and prompt_tokens > 0:
        cfg.chars_per_token = min(8.0, max(1.0, sent_chars / prompt_tokens))
    return turn


async def stream(http: httpx.AsyncClient, url: str, body: dict[str, Any],
                 round_index: int,
                 emit_fragment: Callable[[Fragment], Awaitable[None]],
                 on_event: Callable[[ToolCallEvent], Any] | None = None) -> Turn:
    """POST ``body`` to ``url`` and read the reply, reporting text pieces to
    ``emit_fragment`` and tool-call progress to ``on_event`` as they arrive."""
    turn = Turn()
    assembler = ToolCallAssembler()
    think = ThinkSplitter()  # classifies streamed pieces for on_fragment only
    raw_content: list[str] = []
    reasoning: list[str] = []

    async def text(piece: str, is_reasoning: bool) -> None:
        await emit_fragment(Fragment(piece, is_reasoning, round_index))

    async def server_reasoning(piece: str) -> None:
        reasoning.append(piece)
        await text(piece, True)

    async def call_fragment(frag: dict[str, Any]) -> None:
        index, created, named = assembler.feed(frag)
        if on_event is None:
            return
        slot = assembler.slots[index]
        if created:
            await maybe_await(on_event(ToolCallEvent("started", index, round_index)))
        if named:
            await maybe_await(on_event(ToolCallEvent("name", index, round_index, slot.name,
                                                      slot.name or "")))
        args = (frag.get("function") or {}).get("arguments")
        if isinstance(args, dict | list):
            args = json.dumps(args, ensure_ascii=False)
        if isinstance(args, str) and args:
            await maybe_await(on_event(ToolCallEvent("arguments", index, round_index,
                                                      slot.name, args)))

    async def content_delta(piece: str) -> None:
        raw_content.append(piece)
        for is_reasoning, part in think.feed(piece):
            await text(part, is_reasoning)

    try:
        async with http.stream("POST", url, json=body) as response:
            if response.status_code >= 400:
                raw = (await response.aread()).decode(errors="replace")
                raise LLMError(f"LLM server answered {response.status_code}: {raw[:500]}",
                               response.status_code, raw)
            ctype = response.headers.get("content-type", "")
            if "text/event-stream" not in ctype and "json" in ctype:
                # a server that ignored stream=true: one complete response
                data = json.loads(await response.aread())
                chunks = [data]
                for chunk in chunks:
                    await _chunk(chunk, turn, call_fragment, server_reasoning,
                                      content_delta, full=True)
            else:
                async for data in sse_data(response.aiter_lines()):
                    if data.strip() == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except ValueError as exc:
                        raise LLMError(f"LLM server sent a malformed event: {data[:200]}",
                                       None, data) from exc
                    await _chunk(chunk, turn, call_fragment, server_reasoning,
                                      content_delta, full=False)
    except httpx.HTTPError as exc:
        raise LLMError(f"LLM server at {url} failed: {exc}") from exc
    for is_reasoning, piece in think.flush():
        await text(piece, is_reasoning)
    turn.content, in_content = split_think("".join(raw_content))
    turn.reasoning = "".join(reasoning) + in_content
    turn.calls = assembler.finish(truncated=turn.finish_reason == "length")
    if on_event is not None:
        for i, call in enumerate(turn.calls):
            kind: Literal["ended", "failed"] = "ended" if call.parse_error is None else "failed"
            detail = call.raw_arguments if call.parse_error is None else call.parse_error
            await maybe_await(on_event(ToolCallEvent(kind, i, round_index, call.name, detail)))
    return turn


async def _chunk(chunk: dict[str, Any], turn: Turn,
                 call_fragment: Callable[[dict[str, Any]], Awaitable[None]],
                 reasoning: Callable[[str], Awaitable[None]],
                 content: Callable[[str], Awaitable[None]], full: bool) -> None:
    if not isinstance(chunk, dict):
        return
    if chunk.get("error"):
        err = chunk["error"]
        detail = err.get("message") if isinstance(err, dict) else str(err)
        raise LLMError(f"LLM server error in stream: {detail}", None, json.dumps(chunk))
    if isinstance(chunk.get("usage"), dict):
        turn.usage = chunk["usage"]
    for choice in chunk.get("choices") or []:
        if choice.get("index", 0) != 0:
            continue
        delta = (choice.get("message") if full else choice.get("delta")) or {}
        r = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(r, str) and r:
            await reasoning(r)
        c = delta.get("content")
        if isinstance(c, list):  # content parts
            c = "".join(p.get("text", "") for p in c if isinstance(p, dict))
        if isinstance(c, str) and c:
            await content(c)
        for i, frag in enumerate(delta.get("tool_calls") or []):
            if not isinstance(frag, dict):
                continue
            if full and "index" not in frag:
                frag = {**frag, "index": i}
            await call_fragment(frag)
        legacy = delta.get("function_call")  # the pre-tools OpenAI shape (old servers)
        if isinstance(legacy, dict) and not delta.get("tool_calls"):
            await call_fragment({"index": "function_call", "function": legacy})
        if choice.get("finish_reason"):
            turn.finish_reason = choice["finish_reason"]
