"""A scripted OpenAI-compatible chat server: real HTTP, real SSE, replayed stream shapes.

Each test gives a *script*: a function ``(body, n) -> Reply`` called for the n-th request
(0-based) with the decoded request body. The server also checks every request the way strict
servers (vLLM, OpenAI) do and answers 400 when the history is invalid — in particular when an
assistant ``tool_call_id`` is not followed by exactly one tool message — so every test of the
agent also proves that the agent never sends such a history.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.client.stub_server import StubServer


@dataclass
class Reply:
    """What the server sends for one request."""

    chunks: list[dict[str, Any] | str] = field(default_factory=list)  # SSE data payloads
    delay_s: float = 0.0  # pause before each chunk
    status: int = 200
    json_body: Any = None  # a non-streaming body (status != 200, or a server ignoring stream)
    blank_lines: bool = True  # False: no blank line between events (a sloppy server)
    done: bool = True  # send data: [DONE]


Script = Callable[[dict[str, Any], int], Reply]


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    """One ``chat.completion.chunk``."""
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
            "model": "scripted", "choices": [{"index": 0, "delta": delta,
                                              "finish_reason": finish}], **extra}


def usage_chunk(prompt: int, completion: int) -> dict[str, Any]:
    """The final usage-only chunk of ``stream_options.include_usage``."""
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
            "model": "scripted", "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion}}


def text_reply(text: str, pieces: int = 3, finish: str = "stop", **kw: Any) -> Reply:
    """A plain text answer split into ``pieces`` chunks."""
    size = max(1, -(-len(text) // pieces))
    parts = [text[i:i + size] for i in range(0, len(text), size)] or [""]
    chunks: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": p}) for p in parts]
    chunks.append(chunk({}, finish))
    return Reply(chunks, **kw)


def tool_call_reply(calls: Iterable[tuple[str, dict[str, Any] | str]], *, split: int = 4,
                    ids: Iterable[str] | None = None, **kw: Any) -> Reply:
    """Well-formed streamed tool calls (index, id and name on the first fragment only)."""
    chunks: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": None})]
    id_list = list(ids) if ids is not None else None
    for i, (name, args) in enumerate(calls):
        raw = args if isinstance(args, str) else json.dumps(args)
        cid = id_list[i] if id_list else f"call_{i}"
        chunks.append(chunk({"tool_calls": [{"index": i, "id": cid, "type": "function",
                                             "function": {"name": name, "arguments": ""}}]}))
        size = max(1, -(-len(raw) // split))
        for j in range(0, len(raw), size):
            chunks.append(chunk({"tool_calls": [{"index": i,
                                                 "function": {"arguments": raw[j:j + size]}}]}))
    chunks.append(chunk({}, "tool_calls"))
    return Reply(chunks, **kw)


def last_tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool messages after the last assistant message of a request."""
    out: list[dict[str, Any]] = []
    for m in reversed(body["messages"]):
        if m.get("role") != "tool":
            break
        out.append(m)
    return list(reversed(out))


def check_history(body: dict[str, Any]) -> str | None:
    """What a strict server would reject in this request, or None."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list"
    open_ids: dict[str, str] = {}
    answered: set[str] = set()
    for i, m in enumerate(messages):
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            return f"messages[{i}]: bad role {role!r}"
        if role == "tool":
            tid = m.get("tool_call_id")
            if tid not in open_ids:
                return f"messages[{i}]: tool_call_id {tid!r} does not answer a pending tool call"
            if tid in answered:
                return f"messages[{i}]: tool_call_id {tid!r} answered twice"
            if m.get("name") != open_ids[tid]:
                return f"messages[{i}]: tool message name does not match its call"
            if not isinstance(m.get("content"), str):
                return f"messages[{i}]: tool content must be a string"
            answered.add(tid)
            continue
        missing = set(open_ids) - answered
        if missing:
            return (f"messages[{i}]: tool_call_id(s) {sorted(missing)} have no tool message "
                    "(every tool call must be answered before the next message)")
        open_ids, answered = {}, set()
        if role == "assistant" and m.get("tool_calls"):
            for tc in m["tool_calls"]:
                if not tc.get("id"):
                    return f"messages[{i}]: tool call without id"
                try:
                    json.loads(tc["function"]["arguments"])
                except (KeyError, TypeError, ValueError):
                    return f"messages[{i}]: tool call arguments are not a JSON string"
                if tc["id"] in open_ids:
                    return f"messages[{i}]: duplicate tool call id {tc['id']!r}"
                open_ids[tc["id"]] = tc["function"]["name"]
    missing = set(open_ids) - answered
    if missing:
        return f"tool_call_id(s) {sorted(missing)} have no tool message"
    if messages[-1].get("role") == "assistant":
        return "the last message must not be an assistant message"
    return None


class ScriptedLLM:
    """The server: ``with ScriptedLLM(script) as llm: Agent(llm.url, "m")``."""

    def __init__(self, script: Script | None = None, *, strict: bool = True) -> None:
        self.script: Script = script or (lambda body, n: text_reply("hello"))
        self.strict = strict
        self.requests: list[dict[str, Any]] = []
        self.rejections: list[str] = []
        self.disconnects = 0
        app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])
        self._stub = StubServer(app)
        self.port = self._stub.port
        self.url = f"{self._stub.url}/v1"

    def __enter__(self) -> ScriptedLLM:
        self._stub.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stub.__exit__(*exc)

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        n = len(self.requests)
        self.requests.append(body)
        if self.strict:
            problem = check_history(body)
            if problem:
                self.rejections.append(problem)
                return JSONResponse({"error": {"message": problem, "type": "invalid_request"}},
                                    status_code=400)
        reply = self.script(body, n)
        if reply.status != 200 or reply.json_body is not None:
            return JSONResponse(reply.json_body, status_code=reply.status)

        async def events():  # type: ignore[no-untyped-def]
            sep = "\n\n" if reply.blank_lines else "\n"
            try:
                for c in reply.chunks:
                    if reply.delay_s:
                        await asyncio.sleep(reply.delay_s)  # sleep-ok: a scripted slow stream
                    data = c if isinstance(c, str) else json.dumps(c)
                    yield f"data: {data}{sep}"
                if reply.done:
                    yield f"data: [DONE]{sep}"
            except asyncio.CancelledError:
                self.disconnects += 1
                raise

        return StreamingResponse(events(), media_type="text/event-stream")
