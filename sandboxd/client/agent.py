"""``Agent``: a multi-round tool-calling loop for OpenAI-compatible local LLM servers.

In the spirit of LM Studio's ``.act()``: the model is called with streaming on; when it asks
for tools they are run (sandboxd tools through the daemon, local Python functions in-process)
and their results are fed back, round after round, until the model answers in text.

What a production loop needs and this one does (choices written down here):

* **One tool message per call.** Every call in an assistant message is answered by exactly one
  ``{"role": "tool", "tool_call_id", "name", "content"}`` message, in request order, whatever
  happened (bad JSON, unknown tool, invalid arguments, policy denial, timeout, exception,
  loop guard, round limit, cancellation). Servers reject a history that breaks this rule.
* **Errors phrased for the model**: each class says what went wrong and what to do instead.
* **Arguments validated** against the tool's schema before anything runs.
* **Sequential by default**; ``parallel_tool_calls=True`` runs one round's calls concurrently,
  at most ``max_parallel`` at a time, results still in request order.
* **Last round without tools**: the round ``max_rounds`` is sent without ``tools`` so that the
  model has to answer. Calls it still makes are answered "not run" and the loop stops.
* **Loop guard**: the third call with the same tool and the same canonical arguments is not
  run; the model is told why, and the next round is sent without tools.
* **Output budget**: a tool result longer than ``tool_output_chars`` keeps its head and tail
  and says how much was cut.
* **Context budget**: with ``context_tokens`` set, the history sent is trimmed to fit (oldest
  tool results are emptied first, then the oldest whole exchanges are dropped; the system
  prompt and the current turn are kept). Token counts are estimated from characters and
  calibrated with the server's ``usage.prompt_tokens`` whenever it reports it.
* **Cancellation**: cancelling ``aact()`` (or Ctrl-C in ``act()``) closes the LLM stream and
  cancels running sandbox calls (the daemon kills and cleans them up when the request goes
  away); unanswered calls get a "cancelled" tool message so that the history stays valid.
* **Tool calls written as text** (``<tool_call>``, ``<|python_tag|>``, ``[TOOL_CALLS]``) are
  used when the structured ``tool_calls`` are empty, for registered tool names only.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from sandboxd.client.errors import (
    ConnectionFailed,
    InvalidArguments,
    NotFound,
    ProblemError,
    RateLimited,
)
from sandboxd.client.render import format_result
from sandboxd.client.sandbox import AsyncSandboxClient, SandboxClient
from sandboxd.client.schema import (
    ArgumentError,
    ToolDefinitionError,
    function_tool_schema,
    validate,
)
from sandboxd.client.stream import (
    ThinkSplitter,
    ToolCallAssembler,
    ToolCallRequest,
    parse_text_tool_calls,
    split_think,
    sse_data,
    strip_think,
)
from sandboxd.models import Result

Message = dict[str, Any]
ErrorKind = Literal[
    "bad_json", "unknown_tool", "invalid_arguments", "denied", "timeout", "tool_error",
    "sandbox_error", "loop_guard", "round_limit", "cancelled",
]
INVALID_REQUEST_KINDS = ("bad_json", "unknown_tool", "invalid_arguments")


class LLMError(Exception):
    """The LLM server refused a request or broke the stream."""

    def __init__(self, message: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


@dataclass
class Fragment:
    """A piece of streamed text. ``reasoning`` marks model thinking (never part of the answer)."""

    content: str
    reasoning: bool = False
    round_index: int = 0


@dataclass
class ToolCallEvent:
    """Progress of a tool call while the model generates it, in LM Studio's order:
    ``started`` -> ``name`` -> ``arguments`` (one per fragment) -> ``ended`` or ``failed``.

    ``index`` is the call's position in the reply; ``text`` is the name, the argument
    fragment, the complete arguments (``ended``) or why they are unusable (``failed``).
    """

    kind: Literal["started", "name", "arguments", "ended", "failed"]
    index: int
    round_index: int
    name: str | None = None
    text: str = ""


@dataclass
class ToolCallError:
    """Why a tool call did not produce a normal result; ``message`` is what the model reads."""

    kind: ErrorKind
    message: str
    field: str | None = None


@dataclass
class ToolCallRecord:
    """What happened to one tool call."""

    round_index: int
    call: ToolCallRequest
    content: str  # the tool message content the model received
    error: ToolCallError | None = None
    result: Result | None = None  # sandbox tools
    value: Any = None  # local functions: the return value
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class ActResult:
    """The outcome of :meth:`Agent.act`."""

    text: str  # the final answer, without <think> blocks
    rounds: int
    messages: list[Message]  # the whole conversation: input + everything added
    new_messages: list[Message]  # only what this act() added
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    stop_reason: Literal["answer", "max_rounds", "loop_guard", "length"] = "answer"
    reasoning: str = ""
    usage: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.text


@dataclass
class LocalTool:
    """A local Python function offered to the model (see :func:`tool`)."""

    fn: Callable[..., Any]
    schema: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.schema["function"]["name"])


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None,
         description: str | None = None) -> Any:
    """Describe a local function as a tool now (raises :class:`ToolDefinitionError` if it
    cannot be described). Usable as ``tool(fn)`` or as a decorator ``@tool(name=...)``."""

    def wrap(f: Callable[..., Any]) -> LocalTool:
        return LocalTool(f, function_tool_schema(f, name=name, description=description))

    return wrap(fn) if fn is not None else wrap


@dataclass
class _Tool:
    name: str
    schema: dict[str, Any]
    fn: Callable[..., Any] | None = None  # None: a sandboxd tool

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema["function"].get("parameters") or {"type": "object", "properties": {}}


@dataclass
class _Turn:
    content: str = ""
    reasoning: str = ""
    calls: list[ToolCallRequest] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None


InvalidRequestHook = Callable[[ToolCallRequest, ToolCallError],
                              "str | ToolCallRequest | Awaitable[Any] | None"]


def truncate_middle(text: str, budget: int) -> str:
    """``text`` cut to about ``budget`` characters, keeping its head and tail."""
    if budget <= 0 or len(text) <= budget:
        return text
    head = int(budget * 0.6)
    tail = max(0, budget - head)
    omitted = len(text) - head - tail
    note = (f"\n[... {omitted} characters omitted: the output had {len(text)} characters; "
            f"showing the first {head} and the last {tail} ...]\n")
    return text[:head] + note + (text[-tail:] if tail else "")


def canonical_arguments(arguments: dict[str, Any] | None) -> str:
    """A stable text form of arguments (for the loop guard)."""
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def _arity(cb: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(cb).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


class Agent:
    """A tool-using agent on an OpenAI-compatible ``/v1/chat/completions`` endpoint.

    ``base_url`` is the API root (``http://localhost:1234/v1`` for LM Studio,
    ``http://localhost:11434/v1`` for Ollama, ``http://localhost:8080/v1`` for llama.cpp).
    ``sandbox`` is a :class:`SandboxClient` or :class:`AsyncSandboxClient` for sandboxd tools.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        sandbox: SandboxClient | AsyncSandboxClient | None = None,
        api_key: str | None = None,
        *,
        session: str | None = None,
        system_prompt: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        context_tokens: int | None = None,
        tool_output_chars: int = 8000,
        llm_timeout_s: float = 600.0,
        extra_body: dict[str, Any] | None = None,
        stream_usage: bool = True,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.sandbox = sandbox
        self.api_key = api_key
        self.session = session
        self.system_prompt = system_prompt
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.context_tokens = context_tokens
        self.tool_output_chars = tool_output_chars
        self.llm_timeout_s = llm_timeout_s
        self.extra_body = dict(extra_body or {})
        self.stream_usage = stream_usage
        self.headers = dict(headers or {})
        self.chars_per_token = 4.0  # calibrated from usage.prompt_tokens
        self._sandbox_schemas: dict[str, dict[str, Any]] | None = None

    # ------------------------------------------------------------ public API

    def act(
        self,
        prompt_or_messages: str | Sequence[Message],
        tools: Sequence[Any] | None = None,
        *,
        max_rounds: int = 10,
        on_message: Callable[[Message], Any] | None = None,
        on_fragment: Callable[..., Any] | None = None,
        on_round_start: Callable[[int], Any] | None = None,
        on_round_end: Callable[[int], Any] | None = None,
        on_tool_result: Callable[[ToolCallRecord], Any] | None = None,
        on_tool_call_event: Callable[[ToolCallEvent], Any] | None = None,
        handle_invalid_tool_request: InvalidRequestHook | None = None,
        parallel_tool_calls: bool = False,
        max_parallel: int = 4,
        tool_timeout_s: float | None = None,
        session: str | None = None,
    ) -> ActResult:
        """Run the loop to completion (blocking); the arguments are those of :meth:`aact`.

        Ctrl-C cancels the running round (sandbox calls included) and raises
        KeyboardInterrupt; every tool call already requested still gets its tool message
        through ``on_message``, so a history kept with ``on_message`` stays valid.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("Agent.act() cannot run inside an event loop; "
                               "use `await agent.aact(...)`")
        return asyncio.run(self.aact(
            prompt_or_messages, tools, max_rounds=max_rounds, on_message=on_message,
            on_fragment=on_fragment, on_round_start=on_round_start, on_round_end=on_round_end,
            on_tool_result=on_tool_result, on_tool_call_event=on_tool_call_event,
            handle_invalid_tool_request=handle_invalid_tool_request,
            parallel_tool_calls=parallel_tool_calls, max_parallel=max_parallel,
            tool_timeout_s=tool_timeout_s, session=session,
        ))

    async def aact(
        self,
        prompt_or_messages: str | Sequence[Message],
        tools: Sequence[Any] | None = None,
        *,
        max_rounds: int = 10,
        on_message: Callable[[Message], Any] | None = None,
        on_fragment: Callable[..., Any] | None = None,
        on_round_start: Callable[[int], Any] | None = None,
        on_round_end: Callable[[int], Any] | None = None,
        on_tool_result: Callable[[ToolCallRecord], Any] | None = None,
        on_tool_call_event: Callable[[ToolCallEvent], Any] | None = None,
        handle_invalid_tool_request: InvalidRequestHook | None = None,
        parallel_tool_calls: bool = False,
        max_parallel: int = 4,
        tool_timeout_s: float | None = None,
        session: str | None = None,
    ) -> ActResult:
        """Run the multi-round tool loop until the model answers in text.

        ``tools``: sandboxd tool names (``"python"``), local functions, or :func:`tool` objects;
        ``None`` offers every available sandboxd tool (none without a sandbox).
        ``on_message(message)`` sees every message added; ``on_fragment(fragment, round_index)``
        every streamed text piece; ``on_round_start/on_round_end(round_index)`` bracket rounds;
        ``on_tool_result(record)`` follows each call; ``on_tool_call_event(event)`` reports a
        call while it is being generated (:class:`ToolCallEvent`).
        ``handle_invalid_tool_request(call, error)`` runs for bad JSON / unknown tool /
        invalid arguments: return ``None`` (default message), a string (message for the
        model), a corrected :class:`ToolCallRequest` (run instead), or raise to abort.
        """
        if max_rounds < 1:
            raise ValueError("max_rounds must be at least 1")
        if max_parallel < 1:
            raise ValueError("max_parallel must be at least 1")
        messages = self._initial_messages(prompt_or_messages)
        start = len(messages)
        frag_arity = _arity(on_fragment) if on_fragment else 0

        async def emit_message(message: Message) -> None:
            messages.append(message)
            if on_message is not None:
                await _maybe_await(on_message(message))

        async def emit_fragment(fragment: Fragment) -> None:
            if on_fragment is None:
                return
            if frag_arity >= 2:
                await _maybe_await(on_fragment(fragment, fragment.round_index))
            else:
                await _maybe_await(on_fragment(fragment))

        own_sandbox: AsyncSandboxClient | None = None
        sandbox: AsyncSandboxClient | None = None
        if isinstance(self.sandbox, SandboxClient):
            own_sandbox = sandbox = self.sandbox.to_async()
        elif isinstance(self.sandbox, AsyncSandboxClient):
            sandbox = self.sandbox
        timeout = httpx.Timeout(self.llm_timeout_s, connect=30.0)
        llm_headers = {"Accept": "text/event-stream", **self.headers}
        if self.api_key:
            llm_headers["Authorization"] = f"Bearer {self.api_key}"
        records: list[ToolCallRecord] = []
        usage_total: dict[str, int] = {}
        reasoning_all: list[str] = []
        seen_calls: dict[str, int] = {}
        stop_reason: Literal["answer", "max_rounds", "loop_guard", "length"] = "answer"
        final_text = ""
        rounds = 0
        pending: list[ToolCallRequest] = []  # calls of the last assistant message not answered
        try:
            async with httpx.AsyncClient(timeout=timeout, headers=llm_headers) as http:
                registry = await self._resolve_tools(tools, sandbox)
                withhold_tools = False
                for round_index in range(max_rounds):
                    rounds = round_index + 1
                    last = round_index == max_rounds - 1
                    offer = bool(registry) and not last and not withhold_tools
                    if on_round_start:
                        await _maybe_await(on_round_start(round_index))
                    turn = await self._complete(http, messages, registry if offer else {},
                                                round_index, emit_fragment, on_tool_call_event)
                    for key, value in (turn.usage or {}).items():
                        if isinstance(value, int):
                            usage_total[key] = usage_total.get(key, 0) + value
                    if turn.reasoning:
                        reasoning_all.append(turn.reasoning)
                    calls = turn.calls
                    content = turn.content
                    if not calls and offer:
                        calls, rest = parse_text_tool_calls(content, set(registry))
                        if calls:
                            content = rest
                            if on_tool_call_event:
                                for i, c in enumerate(calls):
                                    for kind, text in (("started", ""), ("name", c.name),
                                                       ("ended", c.raw_arguments)):
                                        await _maybe_await(on_tool_call_event(ToolCallEvent(
                                            kind, i, round_index, c.name, text)))
                    assistant: Message = {"role": "assistant", "content": strip_think(content)
                                          if calls else content}
                    if calls:
                        assistant["tool_calls"] = [c.openai() for c in calls]
                        pending = list(calls)
                    await emit_message(assistant)
                    if not calls:
                        final_text = strip_think(content)
                        if turn.finish_reason == "length":
                            stop_reason = "length"
                        elif not offer and registry and (last or withhold_tools):
                            stop_reason = "loop_guard" if withhold_tools else "max_rounds"
                        if on_round_end:
                            await _maybe_await(on_round_end(round_index))
                        break
                    if not offer:
                        # the model called tools although none were offered: answer, then stop
                        why = ("the tool-call limit of this task was reached" if last or
                               not withhold_tools else "the loop guard withheld tools")
                        for call in calls:
                            msg = (f"Not run: {why}. Do not call tools any more; answer the "
                                   "user with what you already know.")
                            rec = ToolCallRecord(round_index, call, msg,
                                                 ToolCallError("round_limit", msg))
                            records.append(rec)
                            await emit_message(self._tool_message(call, msg))
                            pending.remove(call)
                            if on_tool_result:
                                await _maybe_await(on_tool_result(rec))
                        final_text = strip_think(content)
                        stop_reason = "loop_guard" if withhold_tools and not last else "max_rounds"
                        if on_round_end:
                            await _maybe_await(on_round_end(round_index))
                        break
                    round_records = await self._run_calls(
                        calls, registry, round_index, sandbox,
                        session=session if session is not None else self.session,
                        seen=seen_calls, parallel=parallel_tool_calls,
                        max_parallel=max_parallel, tool_timeout_s=tool_timeout_s,
                        hook=handle_invalid_tool_request,
                    )
                    for rec in round_records:
                        records.append(rec)
                        await emit_message(self._tool_message(rec.call, rec.content))
                        pending = [c for c in pending if c.id != rec.call.id]
                        if on_tool_result:
                            await _maybe_await(on_tool_result(rec))
                    if any(r.error and r.error.kind == "loop_guard" for r in round_records):
                        withhold_tools = True
                    if on_round_end:
                        await _maybe_await(on_round_end(round_index))
                else:  # pragma: no cover - the last round always breaks
                    stop_reason = "max_rounds"
        except BaseException:
            # keep the history valid: every call gets its one tool message
            for call in pending:
                msg = "Cancelled: this call was interrupted before it finished."
                message = self._tool_message(call, msg)
                messages.append(message)
                if on_message is not None:
                    with contextlib.suppress(Exception):
                        await _maybe_await(on_message(message))
            raise
        finally:
            if own_sandbox is not None:
                await own_sandbox.aclose()
        return ActResult(
            text=final_text, rounds=rounds, messages=messages, new_messages=messages[start:],
            tool_calls=records, stop_reason=stop_reason, reasoning="\n".join(reasoning_all),
            usage=usage_total,
        )

    # ------------------------------------------------------------ messages

    def _initial_messages(self, prompt_or_messages: str | Sequence[Message]) -> list[Message]:
        if isinstance(prompt_or_messages, str):
            messages: list[Message] = [{"role": "user", "content": prompt_or_messages}]
        else:
            messages = [dict(m) for m in prompt_or_messages]
            if not messages:
                raise ValueError("act() needs a prompt or at least one message")
        if self.system_prompt and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    @staticmethod
    def _tool_message(call: ToolCallRequest, content: str) -> Message:
        return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}

    # ------------------------------------------------------------ tools

    async def _resolve_tools(self, tools: Sequence[Any] | None,
                             sandbox: AsyncSandboxClient | None) -> dict[str, _Tool]:
        registry: dict[str, _Tool] = {}
        wanted = list(tools) if tools is not None else None
        names = [t for t in (wanted or []) if isinstance(t, str)]
        if (wanted is None and sandbox is not None) or names:
            if sandbox is None:
                raise ValueError(f"sandboxd tools {names} need Agent(sandbox=SandboxClient(...))")
            schemas = await self._sandbox_tools(sandbox, refresh=False)
            missing = [n for n in names if n not in schemas]
            if missing:
                schemas = await self._sandbox_tools(sandbox, refresh=True)
                missing = [n for n in names if n not in schemas]
            if missing:
                raise ValueError(f"sandboxd has no tool named {', '.join(missing)} for this "
                                 f"client (available: {', '.join(sorted(schemas)) or 'none'})")
            for n in (names if wanted is not None else sorted(schemas)):
                registry[n] = _Tool(n, schemas[n])
        for entry in wanted or []:
            if isinstance(entry, str):
                continue
            if isinstance(entry, LocalTool):
                local = entry
            elif callable(entry):
                local = LocalTool(entry, function_tool_schema(entry))
            else:
                raise ToolDefinitionError(f"cannot use {entry!r} as a tool: give a sandboxd "
                                          "tool name, a function, or tool(fn)")
            if local.name in registry:
                raise ToolDefinitionError(f"two tools are named {local.name!r}")
            registry[local.name] = _Tool(local.name, local.schema, local.fn)
        return registry

    async def _sandbox_tools(self, sandbox: AsyncSandboxClient,
                             refresh: bool) -> dict[str, dict[str, Any]]:
        if self._sandbox_schemas is None or refresh:
            listed = await sandbox.tools("openai")
            self._sandbox_schemas = {t["function"]["name"]: t for t in listed}
        return self._sandbox_schemas

    async def _run_calls(self, calls: list[ToolCallRequest], registry: dict[str, _Tool],
                         round_index: int, sandbox: AsyncSandboxClient | None, *,
                         session: str | None, seen: dict[str, int], parallel: bool,
                         max_parallel: int, tool_timeout_s: float | None,
                         hook: InvalidRequestHook | None) -> list[ToolCallRecord]:
        # checks run in order first (deterministic loop-guard counting), execution may overlap
        plans: list[tuple[ToolCallRequest, ToolCallRecord | None, ToolCallRequest]] = []
        for call in calls:
            effective, early = await self._check_call(call, registry, round_index, seen, hook)
            plans.append((call, early, effective))

        sem = asyncio.Semaphore(max_parallel if parallel else 1)

        async def run(plan: tuple[ToolCallRequest, ToolCallRecord | None, ToolCallRequest]
                      ) -> ToolCallRecord:
            call, early, effective = plan
            if early is not None:
                return early
            async with sem:
                rec = await self._execute(effective, registry[effective.name], round_index,
                                          sandbox, session, tool_timeout_s)
            rec.call = call  # the tool message answers the id the model used
            return rec

        if parallel and len(plans) > 1:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(run(p)) for p in plans]
            return [t.result() for t in tasks]
        return [await run(p) for p in plans]

    async def _check_call(self, call: ToolCallRequest, registry: dict[str, _Tool],
                          round_index: int, seen: dict[str, int],
                          hook: InvalidRequestHook | None
                          ) -> tuple[ToolCallRequest, ToolCallRecord | None]:
        error = self._invalid(call, registry)
        if error is not None and hook is not None:
            answer = await _maybe_await(hook(call, error))
            if isinstance(answer, ToolCallRequest):
                fixed = ToolCallRequest(call.id, answer.name, answer.arguments,
                                        answer.raw_arguments, answer.parse_error, call.source)
                error = self._invalid(fixed, registry)
                if error is None:
                    call = fixed
            elif isinstance(answer, str):
                error = ToolCallError(error.kind, answer, error.field)
        if error is not None:
            return call, ToolCallRecord(round_index, call, self._budget(error.message), error)
        key = f"{call.name}\0{canonical_arguments(call.arguments)}"
        seen[key] = seen.get(key, 0) + 1
        if seen[key] >= 3:
            msg = (f"Loop guard: you already called `{call.name}` with exactly these arguments "
                   f"{seen[key] - 1} times and got the results above; it was not run again. "
                   "Use those results, or try something different, or answer the user.")
            return call, ToolCallRecord(round_index, call, msg, ToolCallError("loop_guard", msg))
        return call, None

    @staticmethod
    def _invalid(call: ToolCallRequest, registry: dict[str, _Tool]) -> ToolCallError | None:
        names = ", ".join(sorted(registry)) or "none"
        if call.name not in registry:
            shown = f"`{call.name}`" if call.name else "(no name)"
            return ToolCallError("unknown_tool", f"Error: there is no tool named {shown}. "
                                 f"Available tools: {names}. Call one of them by its exact name.")
        if call.arguments is None:
            raw = call.raw_arguments if len(call.raw_arguments) <= 200 else (
                call.raw_arguments[:200] + "...")
            return ToolCallError(
                "bad_json",
                f"Error: the arguments of your `{call.name}` call are not valid JSON "
                f"({call.parse_error}): {raw!r}. Nothing was run. Call `{call.name}` again with "
                "the arguments as one complete JSON object.")
        try:
            validate(registry[call.name].parameters, call.arguments)
        except ArgumentError as exc:
            return ToolCallError(
                "invalid_arguments",
                f"Error: invalid arguments for `{call.name}`: argument '{exc.field}' "
                f"{exc.detail}. Nothing was run. Fix that argument and call again.",
                exc.field)
        return None

    def _budget(self, text: str) -> str:
        return truncate_middle(text, self.tool_output_chars)

    async def _execute(self, call: ToolCallRequest, spec: _Tool, round_index: int,
                       sandbox: AsyncSandboxClient | None, session: str | None,
                       tool_timeout_s: float | None) -> ToolCallRecord:
        started = time.monotonic()
        args = call.arguments or {}
        rec = ToolCallRecord(round_index, call, "")
        if spec.fn is None:
            assert sandbox is not None
            rec.result, rec.error, text = await self._run_sandbox(
                sandbox, call.name, args, session, tool_timeout_s)
        else:
            rec.value, rec.error, text = await self._run_local(spec.fn, call.name, args,
                                                              tool_timeout_s)
        rec.content = self._budget(text)
        rec.duration_s = time.monotonic() - started
        return rec

    async def _run_sandbox(self, sandbox: AsyncSandboxClient, name: str, args: dict[str, Any],
                           session: str | None, tool_timeout_s: float | None
                           ) -> tuple[Result | None, ToolCallError | None, str]:
        limits = {"timeout_s": tool_timeout_s} if tool_timeout_s else None
        http_timeout = (tool_timeout_s + 60.0) if tool_timeout_s else None
        try:
            result = await sandbox.invoke(name, args, session=session, limits=limits,
                                          timeout=http_timeout)
        except InvalidArguments as exc:
            field_name = exc.field or "(arguments)"
            msg = (f"Error: invalid arguments for `{name}`: argument '{field_name}': "
                   f"{exc.detail or exc.title}. Nothing was run. Fix that argument and call again.")
            return None, ToolCallError("invalid_arguments", msg, exc.field), msg
        except NotFound as exc:
            msg = (f"Error: `{name}` is not available in the sandbox ({exc.detail}). "
                   "Use another tool.")
            return None, ToolCallError("unknown_tool", msg), msg
        except RateLimited as exc:
            msg = (f"Error: the sandbox is busy and did not run `{name}` "
                   f"({exc.detail or 'rate limited'}). Try again later or do without it.")
            return None, ToolCallError("sandbox_error", msg), msg
        except (ProblemError, ConnectionFailed) as exc:
            msg = f"Error: the sandbox could not run `{name}`: {exc}. Nothing was run."
            return None, ToolCallError("sandbox_error", msg), msg
        status = str(result.status)
        body = format_result(result)
        if status == "ok":
            return result, None, body
        if status in ("denied", "rejected"):
            rule = f" [{result.policy.source}: {result.policy.rule}]" if result.policy else ""
            why = result.message or body
            msg = (f"Denied by policy: {why}{rule}. The call was not run; do not repeat it. "
                   "Choose an allowed alternative or tell the user it is not permitted.")
            return result, ToolCallError("denied", msg), msg
        if status == "timeout":
            limit = result.limits.timeout_s if result.limits else tool_timeout_s
            msg = (f"Error: `{name}` timed out after {limit:g} s and was stopped "
                   f"({result.termination.reason}). Make the work smaller or faster and try "
                   f"again.\n{body}")
            return result, ToolCallError("timeout", msg), msg
        if status == "killed":
            msg = (f"Error: `{name}` was stopped: {result.termination.reason} "
                   f"(a sandbox limit). Use less memory/processes/output and try again.\n{body}")
            return result, ToolCallError("tool_error", msg), msg
        msg = (f"Error: `{name}` failed.\n{body}\nRead the error above, fix the cause and try "
               "again if it helps.")
        return result, ToolCallError("tool_error", msg), msg

    async def _run_local(self, fn: Callable[..., Any], name: str, args: dict[str, Any],
                         tool_timeout_s: float | None
                         ) -> tuple[Any, ToolCallError | None, str]:
        """Run a local function: ``async def`` ones on the loop (cancellable), plain ones in a
        worker thread (a thread cannot be killed: on timeout or cancel its result is dropped)."""
        try:
            coro = fn(**args) if inspect.iscoroutinefunction(fn) else asyncio.to_thread(fn, **args)
            value = await asyncio.wait_for(coro, tool_timeout_s)
        except TimeoutError:
            msg = (f"Error: `{name}` timed out after {tool_timeout_s:g} s. Make the request "
                   "smaller and try again, or do without it.")
            return None, ToolCallError("timeout", msg), msg
        except Exception as exc:
            msg = (f"Error: `{name}` raised {type(exc).__name__}: {exc}. Fix the arguments if "
                   "that is the cause, or try something else.")
            return None, ToolCallError("tool_error", msg), msg
        if isinstance(value, str):
            text = value
        elif value is None:
            text = "(no result)"
        else:
            try:
                text = json.dumps(value, ensure_ascii=False, default=str)
            except (TypeError, ValueError):
                text = repr(value)
        return value, None, text

    # ------------------------------------------------------------ the LLM

    def _fit(self, messages: list[Message], tools: list[dict[str, Any]]) -> list[Message]:
        """The history to send, trimmed to ``context_tokens`` (see the module docstring).

        Never touched: system messages, the last user message, and the latest assistant
        message with everything after it. First the oldest tool results are emptied, then the
        oldest exchanges are dropped whole (an assistant message with its tool results).
        """
        if not self.context_tokens:
            return messages
        reserve = self.max_tokens or 1024
        budget = max(1, self.context_tokens - reserve)
        tools_chars = len(json.dumps(tools)) if tools else 0

        def tokens(msgs: list[Message]) -> float:
            chars = sum(len(json.dumps(m, ensure_ascii=False)) for m in msgs) + tools_chars
            return chars / self.chars_per_token

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

    async def _complete(self, http: httpx.AsyncClient, messages: list[Message],
                        registry: dict[str, _Tool], round_index: int,
                        emit_fragment: Callable[[Fragment], Awaitable[None]],
                        on_event: Callable[[ToolCallEvent], Any] | None = None) -> _Turn:
        tools = [t.schema for t in registry.values()]
        sent = self._fit(messages, tools)
        body: dict[str, Any] = {"model": self.model, "messages": sent, "stream": True}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        if self.stream_usage:
            body["stream_options"] = {"include_usage": True}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        body.update(self.extra_body)
        sent_chars = sum(len(json.dumps(m, ensure_ascii=False)) for m in sent) + (
            len(json.dumps(tools)) if tools else 0)
        url = f"{self.base_url}/chat/completions"
        try:
            turn = await self._stream(http, url, body, round_index, emit_fragment, on_event)
        except LLMError as exc:
            if exc.status == 400 and "stream_options" in exc.body and "stream_options" in body:
                # an older server that rejects stream_options: ask again without it
                self.stream_usage = False
                body.pop("stream_options")
                turn = await self._stream(http, url, body, round_index, emit_fragment, on_event)
            else:
                raise
        prompt_tokens = (turn.usage or {}).get("prompt_tokens")
        if isinstance(prompt_tokens, int) and prompt_tokens > 0:
            self.chars_per_token = min(8.0, max(1.0, sent_chars / prompt_tokens))
        return turn

    async def _stream(self, http: httpx.AsyncClient, url: str, body: dict[str, Any],
                      round_index: int,
                      emit_fragment: Callable[[Fragment], Awaitable[None]],
                      on_event: Callable[[ToolCallEvent], Any] | None = None) -> _Turn:
        turn = _Turn()
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
                await _maybe_await(on_event(ToolCallEvent("started", index, round_index)))
            if named:
                await _maybe_await(on_event(ToolCallEvent("name", index, round_index, slot.name,
                                                          slot.name or "")))
            args = (frag.get("function") or {}).get("arguments")
            if isinstance(args, dict | list):
                args = json.dumps(args, ensure_ascii=False)
            if isinstance(args, str) and args:
                await _maybe_await(on_event(ToolCallEvent("arguments", index, round_index,
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
                        await self._chunk(chunk, turn, call_fragment, server_reasoning,
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
                        await self._chunk(chunk, turn, call_fragment, server_reasoning,
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
                text = call.raw_arguments if call.parse_error is None else call.parse_error
                await _maybe_await(on_event(ToolCallEvent(kind, i, round_index, call.name, text)))
        return turn

    @staticmethod
    async def _chunk(chunk: dict[str, Any], turn: _Turn,
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
