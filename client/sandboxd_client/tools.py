"""The tool side of the agent: each call the model makes is checked (known tool, valid JSON,
arguments valid against the schema, the loop guard) and run, in sandboxd or as a local Python
function, and answered by exactly one record whose ``content`` is what the model reads."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandboxd_client.async_sandbox import AsyncSandboxClient
from sandboxd_client.deadline import within
from sandboxd_client.errors import (
    ConnectionFailed,
    InvalidArguments,
    NotFound,
    ProblemError,
    RateLimited,
)
from sandboxd_client.events import ToolOutput
from sandboxd_client.models import Result
from sandboxd_client.records import (
    InvalidRequestHook,
    ToolCallError,
    ToolCallRecord,
    canonical_arguments,
    maybe_await,
    truncate_middle,
)
from sandboxd_client.render import format_result
from sandboxd_client.schema import ArgumentError, validate
from sandboxd_client.stream import ToolCallRequest


@dataclass
class OfferedTool:
    """A tool offered to the model: its OpenAI schema, and the local function (None: a
    sandboxd tool)."""

    name: str
    schema: dict[str, Any]
    fn: Callable[..., Any] | None = None  # None: a sandboxd tool

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON Schema its arguments are checked against."""
        return self.schema["function"].get("parameters") or {"type": "object", "properties": {}}


class ToolRunner:
    """Runs the tool calls of a round; every result is cut to ``tool_output_chars``."""

    def __init__(self, tool_output_chars: int,
                 on_output: Callable[[ToolCallRequest, ToolOutput], Any] | None = None
                 ) -> None:
        self.tool_output_chars = tool_output_chars
        self.on_output = on_output  # sandbox output as it comes (streamed invoke)

    async def run_calls(self, calls: list[ToolCallRequest], registry: dict[str, OfferedTool],
                         round_index: int, sandbox: AsyncSandboxClient | None, *,
                         session: str | None, seen: dict[str, int], parallel: bool,
                         max_parallel: int, tool_timeout_s: float | None,
                         hook: InvalidRequestHook | None) -> list[ToolCallRecord]:
        """Answer one round's calls, one record per call in request order."""
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

    async def _check_call(self, call: ToolCallRequest, registry: dict[str, OfferedTool],
                          round_index: int, seen: dict[str, int],
                          hook: InvalidRequestHook | None
                          ) -> tuple[ToolCallRequest, ToolCallRecord | None]:
        error = self._invalid(call, registry)
        if error is not None and hook is not None:
            call, error = await self._ask_hook(hook, call, error, registry)
        if error is not None:
            return call, ToolCallRecord(round_index, call, self._budget(error.message), error)
        return call, _loop_guard(call, round_index, seen)

    async def _ask_hook(self, hook: InvalidRequestHook, call: ToolCallRequest,
                        error: ToolCallError, registry: dict[str, OfferedTool]
                        ) -> tuple[ToolCallRequest, ToolCallError | None]:
        """The invalid-request hook's say: a corrected call (used when it is valid), a
        message for the model instead of ours, or nothing (ours stands)."""
        answer = await maybe_await(hook(call, error))
        if isinstance(answer, str):
            return call, ToolCallError(error.kind, answer, error.field)
        if not isinstance(answer, ToolCallRequest):
            return call, error
        fixed = ToolCallRequest(call.id, answer.name, answer.arguments,
                                answer.raw_arguments, answer.parse_error, call.source)
        still = self._invalid(fixed, registry)
        return (call, still) if still is not None else (fixed, None)

    @staticmethod
    def _invalid(call: ToolCallRequest, registry: dict[str, OfferedTool]) -> ToolCallError | None:
        if call.name not in registry:
            return _unknown_tool_error(call, registry)
        if call.arguments is None:
            return _bad_json_error(call)
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

    async def _execute(self, call: ToolCallRequest, spec: OfferedTool, round_index: int,
                       sandbox: AsyncSandboxClient | None, session: str | None,
                       tool_timeout_s: float | None) -> ToolCallRecord:
        started = time.monotonic()
        args = call.arguments or {}
        rec = ToolCallRecord(round_index, call, "")
        if spec.fn is None:
            assert sandbox is not None
            rec.result, rec.error, text = await self._run_sandbox(
                sandbox, call.name, args, session, tool_timeout_s, call)
        else:
            rec.value, rec.error, text = await self._run_local(spec.fn, call.name, args,
                                                              tool_timeout_s)
        rec.content = self._budget(text)
        rec.duration_s = time.monotonic() - started
        return rec

    async def _invoke(self, sandbox: AsyncSandboxClient, call: ToolCallRequest,
                      args: dict[str, Any], session: str | None,
                      limits: dict[str, Any] | None, http_timeout: float | None) -> Result:
        """One sandbox call; streamed when someone watches its output (``on_output``)."""
        if self.on_output is None:
            return await sandbox.invoke(call.name, args, session=session, limits=limits,
                                        timeout=http_timeout)
        result: Result | None = None
        async for item in sandbox.invoke_stream(call.name, args, session=session,
                                                limits=limits):
            if isinstance(item, ToolOutput):
                await maybe_await(self.on_output(call, item))
            else:
                result = item
        assert result is not None  # invoke_stream ends with the result or raises
        return result

    async def _run_sandbox(self, sandbox: AsyncSandboxClient, name: str, args: dict[str, Any],
                           session: str | None, tool_timeout_s: float | None,
                           call: ToolCallRequest
                           ) -> tuple[Result | None, ToolCallError | None, str]:
        limits = {"timeout_s": tool_timeout_s} if tool_timeout_s else None
        http_timeout = (tool_timeout_s + 60.0) if tool_timeout_s else None
        try:
            result = await self._invoke(sandbox, call, args, session, limits, http_timeout)
        except (ProblemError, ConnectionFailed) as exc:
            error = _not_run_error(name, exc)
            return None, error, error.message
        body = format_result(result)
        status = str(result.status)
        if status == "ok":
            return result, None, body
        error = _RESULT_ERRORS.get(status, _failed)(name, result, body, tool_timeout_s)
        return result, error, error.message

    async def _run_local(self, fn: Callable[..., Any], name: str, args: dict[str, Any],
                         tool_timeout_s: float | None
                         ) -> tuple[Any, ToolCallError | None, str]:
        """Run a local function: ``async def`` ones on the loop (cancellable), plain ones in a
        worker thread (a thread cannot be killed: on timeout or cancel its result is dropped)."""
        try:
            coro = fn(**args) if inspect.iscoroutinefunction(fn) else asyncio.to_thread(fn, **args)
            if tool_timeout_s is None:
                value = await coro
            else:
                finished, value = await within(coro, tool_timeout_s)
                if not finished:
                    raise TimeoutError
        except TimeoutError:
            msg = (f"Error: `{name}` timed out after {tool_timeout_s:g} s. Make the request "
                   "smaller and try again, or do without it.")
            return None, ToolCallError("timeout", msg), msg
        except Exception as exc:
            msg = (f"Error: `{name}` raised {type(exc).__name__}: {exc}. Fix the arguments if "
                   "that is the cause, or try something else.")
            return None, ToolCallError("tool_error", msg), msg
        return value, None, _local_text(value)


def _local_text(value: Any) -> str:
    """What the model reads of a local function's return value: a string as it is, else
    JSON (``repr`` for what JSON cannot say)."""
    if isinstance(value, str):
        return value
    if value is None:
        return "(no result)"
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _unknown_tool_error(call: ToolCallRequest, registry: dict[str, OfferedTool]) -> ToolCallError:
    """A call of a tool that is not offered: the model reads the names it can use."""
    names = ", ".join(sorted(registry)) or "none"
    shown = f"`{call.name}`" if call.name else "(no name)"
    return ToolCallError("unknown_tool", f"Error: there is no tool named {shown}. "
                         f"Available tools: {names}. Call one of them by its exact name.")


def _bad_json_error(call: ToolCallRequest) -> ToolCallError:
    """A call whose arguments are not JSON: the model reads why and their start."""
    raw = call.raw_arguments if len(call.raw_arguments) <= 200 else (
        call.raw_arguments[:200] + "...")
    return ToolCallError(
        "bad_json",
        f"Error: the arguments of your `{call.name}` call are not valid JSON "
        f"({call.parse_error}): {raw!r}. Nothing was run. Call `{call.name}` again with "
        "the arguments as one complete JSON object.")


def _loop_guard(call: ToolCallRequest, round_index: int,
                seen: dict[str, int]) -> ToolCallRecord | None:
    """Count the call; its third identical request (name and arguments) is not run."""
    key = f"{call.name}\0{canonical_arguments(call.arguments)}"
    seen[key] = seen.get(key, 0) + 1
    if seen[key] < 3:
        return None
    msg = (f"Loop guard: you already called `{call.name}` with exactly these arguments "
           f"{seen[key] - 1} times and got the results above; it was not run again. "
           "Use those results, or try something different, or answer the user.")
    return ToolCallRecord(round_index, call, msg, ToolCallError("loop_guard", msg))


def _not_run_error(name: str, exc: ProblemError | ConnectionFailed) -> ToolCallError:
    """What the model reads when the sandbox refused or could not take the call."""
    if isinstance(exc, InvalidArguments):
        field_name = exc.field or "(arguments)"
        return ToolCallError("invalid_arguments", (
            f"Error: invalid arguments for `{name}`: argument '{field_name}': "
            f"{exc.detail or exc.title}. Nothing was run. Fix that argument and call again."),
            exc.field)
    if isinstance(exc, NotFound):
        return ToolCallError("unknown_tool", f"Error: `{name}` is not available in the sandbox "
                             f"({exc.detail}). Use another tool.")
    if isinstance(exc, RateLimited):
        return ToolCallError("sandbox_error", (
            f"Error: the sandbox is busy and did not run `{name}` "
            f"({exc.detail or 'rate limited'}). Try again later or do without it."))
    return ToolCallError("sandbox_error",
                         f"Error: the sandbox could not run `{name}`: {exc}. Nothing was run.")


# what the model reads of a result that is not ok, by its status


def _denied(name: str, result: Result, body: str, tool_timeout_s: float | None) -> ToolCallError:
    """A call the policy refused: the model is told not to repeat it."""
    rule = f" [{result.policy.source}: {result.policy.rule}]" if result.policy else ""
    why = result.message or body
    return ToolCallError("denied", (
        f"Denied by policy: {why}{rule}. The call was not run; do not repeat it. "
        "Choose an allowed alternative or tell the user it is not permitted."))


def _timed_out(name: str, result: Result, body: str,
               tool_timeout_s: float | None) -> ToolCallError:
    """A call stopped at its time limit, with what it printed."""
    limit = (result.limits or {}).get("timeout_s", tool_timeout_s)
    return ToolCallError("timeout", (
        f"Error: `{name}` timed out after {limit:g} s and was stopped "
        f"({result.termination.reason}). Make the work smaller or faster and try "
        f"again.\n{body}"))


def _killed(name: str, result: Result, body: str, tool_timeout_s: float | None) -> ToolCallError:
    """A call stopped by another sandbox limit, with what it printed."""
    return ToolCallError("tool_error", (
        f"Error: `{name}` was stopped: {result.termination.reason} "
        f"(a sandbox limit). Use less memory/processes/output and try again.\n{body}"))


def _failed(name: str, result: Result, body: str, tool_timeout_s: float | None) -> ToolCallError:
    """A call that ran and failed: its output, to fix the cause."""
    return ToolCallError("tool_error", (
        f"Error: `{name}` failed.\n{body}\nRead the error above, fix the cause and try "
        "again if it helps."))


_RESULT_ERRORS: dict[str, Callable[[str, Result, str, float | None], ToolCallError]] = {
    "denied": _denied, "rejected": _denied, "timeout": _timed_out, "killed": _killed,
}
