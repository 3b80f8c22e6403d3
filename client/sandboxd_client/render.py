"""What a model reads of a sandbox result: the one definition, used by the :class:`Agent` loop
(tool messages) and by the daemon's MCP front door (the ``text`` content of ``tools/call``)."""

from __future__ import annotations

import base64
import binascii
import json

from sandboxd_client.models import Result
from sandboxd_client.output_items import Output, png_size

#: image MIME types a model is told about with a placeholder, most preferred first
IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml")


def describe_output(item: Output) -> str:
    """What a model reads of one display item: an image as ``[image: 640x480 png]`` (it
    cannot see it here; MCP hosts also get the image itself), else its ``text/plain``."""
    mime = next((m for m in IMAGE_TYPES if m in item.data), None)
    if mime is not None:
        return _image_placeholder(mime, item.data[mime])
    if "text/plain" in item.data:
        return str(item.data["text/plain"])
    if "application/json" in item.data:
        return json.dumps(item.data["application/json"], ensure_ascii=False)
    return "[display item: " + ", ".join(sorted(item.data)) + "]"


def _image_placeholder(mime: str, data: str) -> str:
    """``[image: 640x480 png]`` (the size when a PNG says it), ``[image: jpeg]``."""
    kind = mime.split("/")[1].split("+")[0]
    size = _png_size(data) if mime == "image/png" else None
    return f"[image: {size[0]}x{size[1]} {kind}]" if size else f"[image: {kind}]"


def _png_size(data: str) -> tuple[int, int] | None:
    """(width, height) of a base64 PNG, None when it does not decode."""
    try:
        return png_size(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError, TypeError):
        return None


def format_result(result: Result) -> str:
    """A sandbox Result as the compact text a model reads."""
    return "\n".join(line for line in _lines(result) if isinstance(line, str)) or "(no output)"


def result_parts(result: Result) -> list[str | Output]:
    """:func:`format_result` as text pieces with the image display items in their place,
    right after the text that names them (``[image: ...]``): what MCP hosts get as ``text``
    and ``image`` content, in execution order, so that a model reads
    each image where the code produced it."""
    parts: list[str | Output] = []
    text: list[str] = []
    for line in _lines(result):
        if isinstance(line, str):
            text.append(line)
            continue
        parts.append("\n".join(text))
        text = []
        parts.append(line)
    if text or not parts:
        parts.append("\n".join(text) or "(no output)")
    return parts


def _lines(result: Result) -> list[str | Output]:
    """The lines a model reads, each image display item after its placeholder line."""
    status = str(result.status)
    if status == "ok" and _only_stdout(result):
        return [result.stdout]
    lines: list[str | Output] = []
    if status != "ok":
        code = result.termination.exit_code
        lines.append(f"status: {status} ({result.termination.reason}"
                     + (f", exit code {code})" if code not in (None, 0) else ")"))
    lines.extend(_in_order(result))
    lines.extend(_value_line(result, status))
    if status != "ok" and result.message:
        lines.append("message: " + result.message)
    return lines


def _only_stdout(result: Result) -> bool:
    """Whether a successful result is read as its bare stdout: nothing else to say, and
    either a file tool (stdout is the content, value only metadata) or no value."""
    if not result.stdout or result.stderr or result.outputs:
        return False
    if any(result.truncated.model_dump().values()):
        return False
    return result.backend == "workspace" or result.value is None


def _value_line(result: Result, status: str) -> list[str | Output]:
    """The last value's line, unless a display item already showed it."""
    # a rich last value (a DataFrame) comes back as a display item too: the model reads it once
    shown = {o.data.get("text/plain") for o in result.outputs}
    if result.value_repr is not None and result.value_repr not in shown:
        return ["value: " + result.value_repr]  # Python's view: a tuple stays a tuple
    value = result.value
    if value is None or (isinstance(value, str) and value in shown):
        return []
    if isinstance(value, str) and not result.stdout and status == "ok":
        return [value]
    return ["value: " + json.dumps(value, ensure_ascii=False, default=str)]


def _in_order(result: Result) -> list[str | Output]:
    """stdout, stderr and display items in execution order (:meth:`Result.sequence`), a
    heading wherever the kind changes, the truncation notes after each stream's last part."""
    parts = result.sequence()
    last = {_kind(part): i for i, part in enumerate(parts)}
    lines: list[str | Output] = []
    previous = None
    for i, part in enumerate(parts):
        kind = _kind(part)
        heading = [f"{kind}:"] if kind != previous else []
        previous = kind
        if isinstance(part, Output):
            lines.extend(heading + [describe_output(part)] + ([part] if part.image else []))
            continue
        name, text = part  # (a stream's parts are never adjacent: each gets its heading)
        lines.append("\n".join([*heading, text.rstrip("\n")]))
        if last[name] == i and getattr(result.truncated, name):
            lines.append(f"({name} was cut at the sandbox output limit)")
    return lines


def _kind(part: Output | tuple[str, str]) -> str:
    """A part's kind: ``display``, or the name of its stream."""
    return "display" if isinstance(part, Output) else part[0]
