"""The agent loop's logic, written once, as a generator of the I/O it needs.

:func:`steps` decides what happens round after round (which tools to offer, what to do with
the model's reply, when to stop) and does no I/O itself: it yields an effect, and the driver
(:meth:`Agent.aact <sandboxd_client.agent.Agent.aact>`) performs it and sends the answer back.

* :class:`Ask`: one LLM round with these tool schemas; the answer is the ``llm.Turn``.
* :class:`RunCalls`: run one round's tool calls; the answer is their records, in order.
* :class:`Notify`: call a user callback (sync or async); the answer is ignored.

Everything the loop learns is kept in :class:`LoopState`, which the driver reads after the
generator returns (the result) or when it is interrupted (the calls still to answer).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from sandboxd_client.records import (
    ActResult,
    Message,
    ToolCallError,
    ToolCallEvent,
    ToolCallRecord,
)
from sandboxd_client.stream import ToolCallRequest, parse_text_tool_calls, strip_think

if TYPE_CHECKING:
    from sandboxd_client.llm import Turn
    from sandboxd_client.tools import OfferedTool

StopReason = Literal["answer", "max_rounds", "loop_guard", "length"]
#: what a call the model makes after the tools were taken away is answered
NOT_RUN = "Not run: {why}. Do not call tools any more; answer the user with what you already know."
CANCELLED = "Cancelled: this call was interrupted before it finished."


@dataclass(frozen=True)
class Ask:
    """Request one LLM round; ``tools`` empty means none offered."""

    tools: list[dict[str, Any]]
    round_index: int


@dataclass(frozen=True)
class RunCalls:
    """Run one round's tool calls (answer: one :class:`ToolCallRecord` per call, in order)."""

    calls: list[ToolCallRequest]
    round_index: int


@dataclass(frozen=True)
class Notify:
    """Call a user callback with ``args`` (awaited when it returns an awaitable)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]


Effect = Ask | RunCalls | Notify
Steps = Generator[Effect, Any, None]


@dataclass(frozen=True)
class Hooks:
    """The user callbacks the loop itself reports to (fragments go through the LLM request)."""

    on_message: Callable[[Message], Any] | None = None
    on_round_start: Callable[[int], Any] | None = None
    on_round_end: Callable[[int], Any] | None = None
    on_tool_result: Callable[[ToolCallRecord], Any] | None = None
    on_tool_call_event: Callable[[ToolCallEvent], Any] | None = None


@dataclass
class LoopState:
    """What one run has gathered so far."""

    messages: list[Message]
    start: int = 0  # messages before this index were given, not produced
    records: list[ToolCallRecord] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    reasoning: list[str] = field(default_factory=list)
    seen_calls: dict[str, int] = field(default_factory=dict)  # loop-guard counts
    tools_withheld: bool = False  # by the loop guard: the next rounds are sent without tools
    stop_reason: StopReason = "answer"
    final_text: str = ""
    rounds: int = 0
    pending: list[ToolCallRequest] = field(default_factory=list)  # calls still unanswered

    def __post_init__(self) -> None:
        self.start = len(self.messages)

    def add_turn(self, turn: Turn) -> None:
        """Count the round's token usage and keep its reasoning."""
        for key, value in (turn.usage or {}).items():
            if isinstance(value, int):
                self.usage[key] = self.usage.get(key, 0) + value
        if turn.reasoning:
            self.reasoning.append(turn.reasoning)

    def result(self) -> ActResult:
        return ActResult(
            text=self.final_text, rounds=self.rounds, messages=self.messages,
            new_messages=self.messages[self.start:], tool_calls=self.records,
            stop_reason=self.stop_reason, reasoning="\n".join(self.reasoning), usage=self.usage,
        )


def tool_message(call: ToolCallRequest, content: str) -> Message:
    """The one tool message that answers ``call``."""
    return {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content}


def steps(state: LoopState, registry: dict[str, OfferedTool], max_rounds: int,
          hooks: Hooks) -> Steps:
    """Run the rounds until the model answers in text (or a limit stops it)."""
    for round_index in range(max_rounds):
        state.rounds = round_index + 1
        if (yield from _round(state, registry, round_index, max_rounds, hooks)):
            return
    state.stop_reason = "max_rounds"  # pragma: no cover - the last round always ends the run


@dataclass(frozen=True)
class _Round:
    """Where a round stands: its index, whether it is the last, whether tools are offered."""

    index: int
    last: bool  # sent without tools so that the model has to answer
    withheld: bool  # the loop guard took the tools away
    offer: bool

    @classmethod
    def of(cls, index: int, max_rounds: int, withheld: bool, has_tools: bool) -> _Round:
        """Round ``index`` of ``max_rounds``: tools are offered unless it is the last one or
        the loop guard withheld them."""
        last = index == max_rounds - 1
        return cls(index, last, withheld, has_tools and not last and not withheld)


def _round(state: LoopState, registry: dict[str, OfferedTool], round_index: int,
           max_rounds: int, hooks: Hooks) -> Generator[Effect, Any, bool]:
    """One round: ask the model, then answer its calls; True when the run ends here."""
    rnd = _Round.of(round_index, max_rounds, state.tools_withheld, bool(registry))
    yield from _notify(hooks.on_round_start, round_index)
    turn: Turn = yield Ask([t.schema for t in registry.values()] if rnd.offer else [],
                           round_index)
    state.add_turn(turn)
    calls, content = turn.calls, turn.content
    if not calls and rnd.offer:
        calls, content = yield from _text_calls(content, registry, round_index, hooks)
    yield from _emit_assistant(state, calls, content, hooks)
    yield from _answer_turn(state, rnd, turn, calls, content, bool(registry), hooks)
    yield from _notify(hooks.on_round_end, round_index)
    return not calls or not rnd.offer


def _answer_turn(state: LoopState, rnd: _Round, turn: Turn, calls: list[ToolCallRequest],
                 content: str, has_tools: bool, hooks: Hooks) -> Steps:
    """A text answer ends the run; calls are run, or refused when no tools were offered."""
    if not calls:
        state.final_text = strip_think(content)
        state.stop_reason = _stop_on_answer(turn.finish_reason, rnd, has_tools)
    elif not rnd.offer:
        # the model called tools although none were offered: answer, then stop
        yield from _refuse(state, calls, rnd, hooks)
        state.final_text = strip_think(content)
        state.stop_reason = "loop_guard" if rnd.withheld and not rnd.last else "max_rounds"
    else:
        yield from _run_calls(state, calls, rnd.index, hooks)


def _run_calls(state: LoopState, calls: list[ToolCallRequest], round_index: int,
               hooks: Hooks) -> Steps:
    """Have the calls run, answer each; a loop-guard refusal withholds the tools from now."""
    records: list[ToolCallRecord] = yield RunCalls(calls, round_index)
    for rec in records:
        yield from _record(state, rec, hooks)
    if any(r.error and r.error.kind == "loop_guard" for r in records):
        state.tools_withheld = True


def _notify(fn: Callable[..., Any] | None, *args: Any) -> Steps:
    if fn is not None:
        yield Notify(fn, args)


def _emit(state: LoopState, message: Message, hooks: Hooks) -> Steps:
    state.messages.append(message)
    yield from _notify(hooks.on_message, message)


def _text_calls(content: str, registry: dict[str, OfferedTool], round_index: int,
                hooks: Hooks) -> Generator[Effect, Any, tuple[list[ToolCallRequest], str]]:
    """Tool calls the model wrote as text (registered names only), reported as if streamed."""
    calls, rest = parse_text_tool_calls(content, set(registry))
    if not calls:
        return calls, content
    for i, c in enumerate(calls):
        events: tuple[tuple[Literal["started", "name", "ended"], str], ...] = (
            ("started", ""), ("name", c.name), ("ended", c.raw_arguments))
        for kind, text in events:
            yield from _notify(hooks.on_tool_call_event,
                               ToolCallEvent(kind, i, round_index, c.name, text))
    return calls, rest


def _emit_assistant(state: LoopState, calls: list[ToolCallRequest], content: str,
                    hooks: Hooks) -> Steps:
    assistant: Message = {"role": "assistant",
                          "content": strip_think(content) if calls else content}
    if calls:
        assistant["tool_calls"] = [c.openai() for c in calls]
        state.pending = list(calls)
    yield from _emit(state, assistant, hooks)


def _stop_on_answer(finish_reason: str | None, rnd: _Round, has_tools: bool) -> StopReason:
    """Why a text answer ended the run: cut by length, or tools taken away, or the answer."""
    if finish_reason == "length":
        return "length"
    if not rnd.offer and has_tools and (rnd.last or rnd.withheld):
        return "loop_guard" if rnd.withheld else "max_rounds"
    return "answer"


def _refuse(state: LoopState, calls: list[ToolCallRequest], rnd: _Round, hooks: Hooks) -> Steps:
    why = ("the tool-call limit of this task was reached" if rnd.last or not rnd.withheld
           else "the loop guard withheld tools")
    msg = NOT_RUN.format(why=why)
    for call in calls:
        rec = ToolCallRecord(rnd.index, call, msg, ToolCallError("round_limit", msg))
        yield from _record(state, rec, hooks, by_id=False)


def _record(state: LoopState, rec: ToolCallRecord, hooks: Hooks, *, by_id: bool = True) -> Steps:
    """Keep a call's record, answer it with its tool message, report it.

    ``by_id``: a run call is no longer pending under its id; a refused one is taken off the
    pending list once (the calls were not checked, two may share an id).
    """
    state.records.append(rec)
    yield from _emit(state, tool_message(rec.call, rec.content), hooks)
    if by_id:
        state.pending = [c for c in state.pending if c.id != rec.call.id]
    else:
        state.pending.remove(rec.call)
    yield from _notify(hooks.on_tool_result, rec)
