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

Modules: :mod:`.agent_steps` (the loop's logic, a generator of the I/O it needs), :mod:`.llm`
(the streamed request to the model), :mod:`.tools` (checking and running tool calls),
:mod:`.records` (what the loop reports); this one is the agent and the driver that performs
the loop's I/O (``act`` runs the same driver in an event loop of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from sandboxd_client.agent_steps import (
    CANCELLED,
    Ask,
    Effect,
    Hooks,
    LoopState,
    Notify,
    Steps,
    steps,
    tool_message,
)
from sandboxd_client.async_sandbox import AsyncSandboxClient
from sandboxd_client.events import ToolOutput
from sandboxd_client.llm import complete
from sandboxd_client.records import (
    ActResult,
    Fragment,
    InvalidRequestHook,
    LocalTool,
    Message,
    ToolCallEvent,
    ToolCallRecord,
    maybe_await,
)
from sandboxd_client.sandbox import SandboxClient
from sandboxd_client.schema import ToolDefinitionError, function_tool_schema
from sandboxd_client.stream import ToolCallRequest
from sandboxd_client.tools import OfferedTool, ToolRunner


def _arity(cb: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(cb).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def _local_tool(entry: Any) -> LocalTool:
    """A local tool from a :func:`tool` object or a plain function."""
    if isinstance(entry, LocalTool):
        return entry
    if callable(entry):
        return LocalTool(entry, function_tool_schema(entry))
    raise ToolDefinitionError(f"cannot use {entry!r} as a tool: give a sandboxd "
                              "tool name, a function, or tool(fn)")


def _fragment_sink(on_fragment: Callable[..., Any] | None
                   ) -> Callable[[Fragment], Awaitable[None]]:
    """``on_fragment`` called as it wants: ``(fragment, round_index)`` or ``(fragment)``."""
    two = _arity(on_fragment) >= 2 if on_fragment else False

    async def emit_fragment(fragment: Fragment) -> None:
        if on_fragment is None:
            return
        if two:
            await maybe_await(on_fragment(fragment, fragment.round_index))
        else:
            await maybe_await(on_fragment(fragment))
    return emit_fragment


async def _answer_pending(state: LoopState, on_message: Callable[[Message], Any] | None) -> None:
    """Keep the history valid after an interruption: every call gets its one tool message."""
    for call in state.pending:
        message = tool_message(call, CANCELLED)
        state.messages.append(message)
        if on_message is not None:
            with contextlib.suppress(Exception):
                await maybe_await(on_message(message))


@dataclass
class _AsyncIO:
    """Performs the effects of :func:`~sandboxd_client.agent_steps.steps` for one run."""

    agent: Agent
    http: httpx.AsyncClient
    sandbox: AsyncSandboxClient | None
    registry: dict[str, OfferedTool]
    state: LoopState
    emit_fragment: Callable[[Fragment], Awaitable[None]]
    on_tool_call_event: Callable[[ToolCallEvent], Any] | None
    session: str | None
    parallel: bool
    max_parallel: int
    tool_timeout_s: float | None
    hook: InvalidRequestHook | None

    async def drive(self, gen: Steps) -> None:
        """Run the generator to its end, sending each effect's answer back into it."""
        answer: Any = None
        with contextlib.closing(gen):
            while True:
                try:
                    effect = gen.send(answer)
                except StopIteration:
                    return
                answer = await self.perform(effect)

    async def perform(self, effect: Effect) -> Any:
        if isinstance(effect, Notify):
            return await maybe_await(effect.fn(*effect.args))
        if isinstance(effect, Ask):
            return await complete(self.agent, self.http, self.state.messages, effect.tools,
                                  effect.round_index, self.emit_fragment,
                                  self.on_tool_call_event)
        runner = ToolRunner(self.agent.tool_output_chars, self.agent.on_tool_output)
        return await runner.run_calls(
            effect.calls, self.registry, effect.round_index, self.sandbox,
            session=self.session, seen=self.state.seen_calls, parallel=self.parallel,
            max_parallel=self.max_parallel, tool_timeout_s=self.tool_timeout_s, hook=self.hook,
        )


class Agent:
    """A tool-using agent on an OpenAI-compatible ``/v1/chat/completions`` endpoint.

    ``base_url`` is the API root (``http://localhost:1234/v1`` for LM Studio,
    ``http://localhost:11434/v1`` for Ollama, ``http://localhost:8080/v1`` for llama.cpp).
    ``sandbox`` is a :class:`SandboxClient` or :class:`AsyncSandboxClient` for sandboxd tools.
    Each run (:meth:`act`) opens a sandboxd session of its own (one workspace, Python variables
    kept between its calls) and deletes it at the end, unless a ``session`` id is given (here
    or to :meth:`act`: it is used and left open) or ``auto_session=False`` (every call then
    gets a fresh workspace).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        sandbox: SandboxClient | AsyncSandboxClient | None = None,
        api_key: str | None = None,
        *,
        session: str | None = None,
        auto_session: bool = True,
        system_prompt: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        context_tokens: int | None = None,
        tool_output_chars: int = 8000,
        llm_timeout_s: float = 600.0,
        extra_body: dict[str, Any] | None = None,
        stream_usage: bool = True,
        headers: dict[str, str] | None = None,
        on_tool_output: Callable[[ToolCallRequest, ToolOutput], Any] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.sandbox = sandbox
        self.api_key = api_key
        self.session = session
        self.auto_session = auto_session
        self.system_prompt = system_prompt
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.context_tokens = context_tokens
        self.tool_output_chars = tool_output_chars
        self.llm_timeout_s = llm_timeout_s
        self.extra_body = dict(extra_body or {})
        self.stream_usage = stream_usage
        self.headers = dict(headers or {})
        # (call, ToolOutput) as a sandbox call's output arrives (sync or async; the calls are
        # then streamed: stdout/stderr chunks and display items, before the result)
        self.on_tool_output = on_tool_output
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
        for name, value in (("max_rounds", max_rounds), ("max_parallel", max_parallel)):
            if value < 1:
                raise ValueError(f"{name} must be at least 1")
        state = LoopState(self._initial_messages(prompt_or_messages))
        hooks = Hooks(on_message, on_round_start, on_round_end, on_tool_result,
                      on_tool_call_event)
        own_sandbox, sandbox = self._async_sandbox()
        opened_session: str | None = None  # the session opened for this run (closed after it)
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(self.llm_timeout_s, connect=30.0),
                                         headers=self._llm_headers()) as http:
                registry = await self._resolve_tools(tools, sandbox)
                run_session, opened_session = await self._session_for(session, sandbox,
                                                                      registry)
                io = _AsyncIO(self, http, sandbox, registry, state, _fragment_sink(on_fragment),
                              hooks.on_tool_call_event, run_session, parallel_tool_calls,
                              max_parallel, tool_timeout_s, handle_invalid_tool_request)
                await io.drive(steps(state, registry, max_rounds, hooks))
        except BaseException:
            await _answer_pending(state, on_message)
            raise
        finally:
            await _release(sandbox, opened_session, own_sandbox)
        return state.result()

    async def _session_for(self, session: str | None, sandbox: AsyncSandboxClient | None,
                           registry: dict[str, OfferedTool]) -> tuple[str | None, str | None]:
        """(the session a run uses, the one it opened for itself and deletes at its end): the
        given one, else a new one when ``auto_session`` is on and a sandbox tool is offered."""
        run_session = session if session is not None else self.session
        if run_session is not None or sandbox is None or not self.auto_session:
            return run_session, None
        if not any(t.fn is None for t in registry.values()):
            return None, None
        opened = (await sandbox.create_session()).id
        return opened, opened

    def _async_sandbox(self) -> tuple[AsyncSandboxClient | None, AsyncSandboxClient | None]:
        """(the async client this run opens and closes, the async client it uses)."""
        if isinstance(self.sandbox, SandboxClient):
            own = self.sandbox.to_async()
            return own, own
        if isinstance(self.sandbox, AsyncSandboxClient):
            return None, self.sandbox
        return None, None

    def _llm_headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream", **self.headers}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

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

    # ------------------------------------------------------------ tools

    async def _resolve_tools(self, tools: Sequence[Any] | None,
                             sandbox: AsyncSandboxClient | None) -> dict[str, OfferedTool]:
        wanted = list(tools) if tools is not None else None
        registry = await self._sandbox_registry(wanted, sandbox)
        for entry in wanted or []:
            if isinstance(entry, str):
                continue
            local = _local_tool(entry)
            if local.name in registry:
                raise ToolDefinitionError(f"two tools are named {local.name!r}")
            registry[local.name] = OfferedTool(local.name, local.schema, local.fn)
        return registry

    async def _sandbox_registry(self, wanted: list[Any] | None,
                                sandbox: AsyncSandboxClient | None) -> dict[str, OfferedTool]:
        """The sandboxd tools named in ``wanted`` (all of them when ``wanted`` is None)."""
        if wanted is None:
            return await self._every_sandbox_tool(sandbox)
        names = [t for t in wanted if isinstance(t, str)]
        if not names:
            return {}
        if sandbox is None:
            raise ValueError(f"sandboxd tools {names} need Agent(sandbox=SandboxClient(...))")
        schemas = await self._schemas_naming(sandbox, names)
        return {n: OfferedTool(n, schemas[n]) for n in names}

    async def _every_sandbox_tool(self, sandbox: AsyncSandboxClient | None
                                  ) -> dict[str, OfferedTool]:
        """Every tool the sandbox offers this client, by name (none without a sandbox)."""
        if sandbox is None:
            return {}
        schemas = await self._sandbox_tools(sandbox, refresh=False)
        return {n: OfferedTool(n, schemas[n]) for n in sorted(schemas)}

    async def _schemas_naming(self, sandbox: AsyncSandboxClient,
                              names: list[str]) -> dict[str, dict[str, Any]]:
        """The sandbox's tool schemas, listed again when the cached list lacks one of ``names``;
        ValueError when the sandbox has no such tool."""
        schemas = await self._sandbox_tools(sandbox, refresh=False)
        if not set(names) <= set(schemas):  # a tool the cached list predates
            schemas = await self._sandbox_tools(sandbox, refresh=True)
        missing = [n for n in names if n not in schemas]
        if missing:
            raise ValueError(f"sandboxd has no tool named {', '.join(missing)} for this "
                             f"client (available: {', '.join(sorted(schemas)) or 'none'})")
        return schemas

    async def _sandbox_tools(self, sandbox: AsyncSandboxClient,
                             refresh: bool) -> dict[str, dict[str, Any]]:
        if self._sandbox_schemas is None or refresh:
            listed = await sandbox.tools("openai")
            self._sandbox_schemas = {t["function"]["name"]: t for t in listed}
        return self._sandbox_schemas


async def _release(sandbox: AsyncSandboxClient | None, opened_session: str | None,
                   own_sandbox: AsyncSandboxClient | None) -> None:
    """End of a run: delete the session it opened, close the async client it made."""
    if opened_session is not None and sandbox is not None:
        with contextlib.suppress(Exception):  # it expires with its TTL otherwise
            await sandbox.delete_session(opened_session)
    if own_sandbox is not None:
        await own_sandbox.aclose()
