"""What a model reads of a sandbox result: the one definition, used by the :class:`Agent` loop
(tool messages) and by the daemon's MCP front door (the ``text`` content of ``tools/call``)."""

from __future__ import annotations

import json

from sandboxd.models import Result


def format_result(result: Result) -> str:
    """A sandbox Result as the compact text a model reads."""
    lines: list[str] = []
    status = str(result.status)
    if status == "ok" and not result.stderr and not any(result.truncated.model_dump().values()):
        if result.backend == "workspace" and result.stdout:
            return result.stdout  # file tools: stdout is the content, value only metadata
        if result.value is None and result.stdout:
            return result.stdout
    if status != "ok":
        code = result.termination.exit_code
        lines.append(f"status: {status} ({result.termination.reason}"
                     + (f", exit code {code})" if code not in (None, 0) else ")"))
    if result.stdout:
        lines.append("stdout:\n" + result.stdout.rstrip("\n"))
        if result.truncated.stdout:
            lines.append("(stdout was cut at the sandbox output limit)")
    if result.stderr:
        lines.append("stderr:\n" + result.stderr.rstrip("\n"))
        if result.truncated.stderr:
            lines.append("(stderr was cut at the sandbox output limit)")
    if result.value is not None:
        if isinstance(result.value, str) and not result.stdout and status == "ok":
            lines.append(result.value)
        else:
            lines.append("value: " + json.dumps(result.value, ensure_ascii=False, default=str))
    if status != "ok" and result.message:
        lines.append("message: " + result.message)
    return "\n".join(lines) if lines else "(no output)"
