"""What the agent loop reports and takes: events, records, results, errors, local tools,
and the small helpers the loop, the LLM stream and the tool runner share."""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from sandboxd_client.models import Result
from sandboxd_client.schema import function_tool_schema
from sandboxd_client.stream import ToolCallRequest

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


async def maybe_await(value: Any) -> Any:
    """``value``, awaited when it is awaitable (callbacks may be sync or async)."""
    if inspect.isawaitable(value):
        return await value
    return value
