"""What a model reads of a sandbox result: the one definition, used by the :class:`Agent` loop
(tool messages) and by the daemon's MCP front door (the ``text`` content of ``tools/call``)."""

from __future__ import annotations

import base64
import binascii
import json

from sandboxd.models import Output, Result
from sandboxd.protocol.display import png_size

#: image MIME types a model is told about with a placeholder, most preferred first
IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml")


def describe_output(item: Output) -> str:
    """What a model reads of one display item: an image as ``[image: 640x480 png]`` (it
    cannot see it here; MCP hosts also get the image itself), else its ``text/plain``."""
    for mime in IMAGE_TYPES:
        if mime in item.data:
            kind = mime.split("/")[1].split("+")[0]
            size = None
            if mime == "image/png":
                try:
                    size = png_size(base64.b64decode(item.data[mime], validate=True))
                except (binascii.Error, ValueError, TypeError):
                    size = None
            return f"[image: {size[0]}x{size[1]} {kind}]" if size else f"[image: {kind}]"
    if "text/plain" in item.data:
        return str(item.data["text/plain"])
    if "application/json" in item.data:
        return json.dumps(item.data["application/json"], ensure_ascii=False)
    return "[display item: " + ", ".join(sorted(item.data)) + "]"


def format_result(result: Result) -> str:
    """A sandbox Result as the compact text a model reads."""
    lines: list[str] = []
    status = str(result.status)
    if (status == "ok" and not result.stderr and not result.outputs
            and not any(result.truncated.model_dump().values())):
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
    # a rich last value (a DataFrame) comes back as a display item too: the model reads it once
    shown = {o.data.get("text/plain") for o in result.outputs}
    if result.value is not None and not (isinstance(result.value, str) and result.value in shown):
        if isinstance(result.value, str) and not result.stdout and status == "ok":
            lines.append(result.value)
        else:
            lines.append("value: " + json.dumps(result.value, ensure_ascii=False, default=str))
    if result.outputs:
        lines.append("display:\n" + "\n".join(describe_output(o) for o in result.outputs))
    if status != "ok" and result.message:
        lines.append("message: " + result.message)
    return "\n".join(lines) if lines else "(no output)"
