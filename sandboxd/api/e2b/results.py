"""sandboxd's results and stream events as the JSON lines of E2B's code interpreter."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

from sandboxd.models import Result, Status
from sandboxd.results.streaming import StreamEvent

#: E2B's result keys by MIME type (the SDK's ``Result`` fields)
MIME_KEYS = {"text/plain": "text", "text/html": "html", "text/markdown": "markdown",
             "image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpeg",
             "application/pdf": "pdf", "text/latex": "latex", "application/json": "json",
             "application/javascript": "javascript"}
TRACEBACK = "Traceback (most recent call last):"
#: the line of a traceback that names the exception: ``Name: value`` (or the name alone), the
#: name qualified as Python prints it (``module.Outer.<locals>.Name``)
_RAISED = re.compile(r"^([A-Za-z_][\w.<>]*)(?::\s?(.*))?$")


def _timestamp() -> int:
    return time.time_ns() // 1000


def bundle(data: dict[str, Any], main: bool) -> dict[str, Any]:
    """A display item's MIME bundle as E2B's ``result`` line."""
    line: dict[str, Any] = {"type": "result", "is_main_result": main}
    extra = {}
    for mime, value in data.items():
        key = MIME_KEYS.get(mime)
        if key is not None:
            line[key] = value
        else:
            extra[mime] = value
    if extra:
        line["extra"] = extra
    return line


def event_line(event: StreamEvent) -> dict[str, Any] | None:
    """One streamed event as a line (None: nothing E2B shows while the cell runs)."""
    text = event.output()
    if text is not None:
        return {"type": event.kind, "text": text, "timestamp": _timestamp()}
    if event.kind == "display" and isinstance(event.data, dict):
        return bundle(event.data.get("data") or {}, False)
    return None


def main_result(result: Result) -> dict[str, Any] | None:
    """The cell's last value as E2B's main result (its text is the value's repr)."""
    if result.value is None:
        return None
    text = result.value_repr if result.value_repr is not None else repr(result.value)
    data: dict[str, Any] = {"text/plain": text}
    if isinstance(result.value, dict | list):
        data["application/json"] = result.value
    return bundle(data, True)


def error(result: Result) -> dict[str, Any] | None:
    """The ``error`` line of a cell that did not end ``ok``: a raised exception's name,
    value and traceback (from its traceback on stderr), else the result's own reason."""
    if result.status is Status.ok:
        return None
    if result.status is Status.error and (
            raised := _traceback_error(result.stderr) or _message_error(result)) is not None:
        return raised
    return _status_error(result)


def _status_error(result: Result) -> dict[str, Any]:
    """The ``error`` line of a cell that raised nothing readable (timed out, killed, refused):
    named after its status, its value the result's message (else its stderr's end)."""
    name = {Status.timeout: "TimeoutError", Status.killed: "KeyboardInterrupt"}.get(
        result.status, "SandboxdError")
    why = result.message or result.stderr.strip()[-4000:] or result.status.value
    return {"type": "error", "name": name, "value": why, "traceback": why}


def _traceback_error(stderr: str) -> dict[str, Any] | None:
    """A Python exception's ``error`` line, from the last traceback on stderr (None: none)."""
    at = stderr.rfind(TRACEBACK)
    if at < 0:
        return None
    traceback = stderr[at:].rstrip("\n")
    raised = _raised(traceback.split("\n"))
    if raised is None:
        return None
    return {"type": "error", "name": raised[0], "value": raised[1], "traceback": traceback}


def _message_error(result: Result) -> dict[str, Any] | None:
    """Another kernel's exception (javascript's), from a message of the form
    ``Name: value`` (None: the message is not one)."""
    said = _RAISED.match((result.message or "").split("\n")[0])
    if said is None or said.group(2) is None:
        return None
    return {"type": "error", "name": said.group(1).rsplit(".", 1)[-1],
            "value": said.group(2), "traceback": result.stderr.rstrip("\n") or said.group(0)}


def _raised(lines: list[str]) -> tuple[str, str] | None:
    """The exception's name (unqualified, as Jupyter's ``ename``) and value (its lines)."""
    for at in range(len(lines) - 1, 0, -1):
        match = _RAISED.match(lines[at])
        if match and not lines[at].startswith((" ", "Traceback")):
            value = "\n".join([match.group(2) or "", *lines[at + 1:]]).strip("\n")
            return match.group(1).rsplit(".", 1)[-1], value
    return None


def final_lines(result: Result) -> Iterator[dict[str, Any]]:
    """What follows the streamed output: the main result, the error, the count, the end."""
    main = main_result(result)
    if main is not None:
        yield main
    failed = error(result)
    if failed is not None:
        yield failed
    calls = result.kernel.calls if result.kernel is not None else 0
    yield {"type": "number_of_executions", "execution_count": calls}
    yield {"type": "end_of_execution"}


def refusal(result: Result) -> str:
    """Why a call was refused, for the SDK's exception: the decision's reason and rule."""
    policy = result.policy
    rule = f" ({policy.source}: {policy.rule})" if policy is not None else ""
    return f"{result.status.value}: {result.message or 'refused by the policy'}{rule}"
