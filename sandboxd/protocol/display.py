"""Display items (a call's rich outputs): the rules both sides share - the sandbox that sends
them (the restricted worker's ``display``, the container runner's) and the daemon that checks them
(:mod:`sandboxd.results.outputs`). Standard library only: the image build copies this file next to
the container runner, like :mod:`sandboxd.protocol.wire` and :mod:`sandboxd.protocol.rules`.

A sandbox sends each item as one ``d`` frame whose payload is JSON:

* ``{"data": {MIME: content, ...}}`` - an item, in Jupyter's mime-bundle convention; or
* ``{"cut": {"mime": MIME, "bytes": N}}`` - an item the sandbox found over
  :attr:`DisplayCaps.item_bytes` and did not send; the daemon turns it into a ``text/plain``
  note saying so.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .decode import Int, Record, member

#: MIME type -> how its content is carried: "text", "base64" or "json"
MIME_TYPES: dict[str, str] = {
    "text/plain": "text",
    "text/html": "text",
    "text/markdown": "text",
    "image/svg+xml": "text",
    "image/png": "base64",
    "image/jpeg": "base64",
    "application/json": "json",
}
#: the first bytes of every image format allowed as base64
SIGNATURES: dict[str, bytes] = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}
#: room in a ``d`` frame beyond the item cap: JSON keys, quoting, escapes of a text item
FRAME_SLACK = 4096
#: the deepest nesting a JSON value from a sandbox may have (display items, the last value):
#: within what every client's parser and the daemon's own encoders take (deeper, one of
#: them would fail on its recursion limit)
MAX_JSON_DEPTH = 64
#: what stands for a JSON value over :data:`MAX_JSON_DEPTH`
TOO_DEEP = f"its JSON nests deeper than {MAX_JSON_DEPTH} levels"


def _depth_first(value: Any) -> Iterator[tuple[Any, int]]:
    """``value`` and every value nested in its lists and dicts (a dict's values), each with
    its depth (1 at the top): depth first and without recursion, so a deep value costs none;
    a container's items are walked only when its reader asks for the next one after it."""
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        yield item, depth
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            todo.extend((v, depth + 1) for v in item)


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON value ``value`` (lists, dicts, scalars) nests deeper than ``limit``
    levels; iterative, so a deep value costs no recursion."""
    return any(depth > limit and isinstance(item, (list, dict))
               for item, depth in _depth_first(value))


#: the longest ``value_repr`` a sandbox reports (characters; longer is cut)
MAX_VALUE_REPR = 64 * 1024


#: the scalar types JSON keeps as they are (exactly these, not subclasses)
_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})


def json_lossy(value: Any) -> bool:
    """Whether JSON changes what ``value`` is (then the result carries its repr too, so a
    model is not misled about the value's type): anything but ``str``, ``int``,
    ``float``, ``bool``, ``None``, ``list`` and ``dict`` with ``str`` keys, of exactly those
    types (a tuple reads as a list, ``{1: 2}`` as ``{"1": 2}``). Iterative; a value over
    :data:`MAX_JSON_DEPTH` counts as lossy."""
    for item, depth in _depth_first(value):
        kind = type(item)
        if kind in _JSON_SCALARS:
            continue
        if depth > MAX_JSON_DEPTH or kind not in (dict, list):
            return True
        if kind is dict and not set(map(type, item)) <= {str}:
            return True
    return False


def value_repr(value: Any) -> str | None:
    """Python's repr of a last value whose JSON is lossy (:func:`json_lossy`), cut at
    :data:`MAX_VALUE_REPR`; None when the JSON says it all or repr fails."""
    if not json_lossy(value):
        return None
    try:
        return repr(value)[:MAX_VALUE_REPR]
    except Exception:
        return None


#: bounds of what :meth:`DisplayCaps.from_wire` accepts
MAX_DISPLAY_ITEM = 2**40
MAX_DISPLAYS = 1_000_000


@dataclass(frozen=True)
class DisplayCaps(Record):
    """How much one call may display: ``item_bytes`` per item (the JSON of its data, images as
    base64), ``count`` items per call (settings ``max_display_bytes`` / ``max_displays``).
    On the wire as ``{"item_bytes": ..., "count": ...}`` (a sandbox cuts items by them)."""

    WIRE_NAME = "display"

    item_bytes: int = member(Int(1, MAX_DISPLAY_ITEM), 2 * 1024 * 1024, required=True)
    count: int = member(Int(0, MAX_DISPLAYS), 32, required=True)

    @property
    def frame_bytes(self) -> int:
        """The largest ``d`` frame payload the daemon accepts: a well-behaved sandbox cuts an
        item by the size of its JSON, so this is the cap plus slack."""
        return self.item_bytes + FRAME_SLACK


def size_text(n: int) -> str:
    """``n`` bytes for a person: ``512 bytes``, ``3.1 KB``, ``2.0 MB``."""
    if n < 1000:
        return f"{n} bytes"
    if n < 1_000_000:
        return f"{n / 1000:.1f} KB"
    return f"{n / 1_000_000:.1f} MB"


def encode_item(data: dict[str, Any], caps: DisplayCaps) -> bytes:
    """A sandbox's ``d`` frame payload for a mime bundle: the item, or a cut record when its
    JSON is over ``caps.item_bytes`` (the largest image's MIME type is named)."""
    text = json.dumps({"data": data}, ensure_ascii=False)
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) <= caps.item_bytes:
        return raw
    mime = max(data, key=lambda m: len(str(data[m]))) if data else "text/plain"
    return json.dumps({"cut": {"mime": mime, "bytes": len(raw)}}).encode()


def png_size(png: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from a PNG's IHDR chunk, or ``None`` when it is not a PNG."""
    if len(png) < 24 or not png.startswith(SIGNATURES["image/png"]) or png[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", png[16:24])
    return width, height


#: IPython's rich-repr methods, by the MIME type each one gives
REPR_METHODS: tuple[tuple[str, str], ...] = (
    ("_repr_html_", "text/html"), ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"), ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"), ("_repr_json_", "application/json"),
)


#: the methods that make an object's display rich (``_repr_json_`` alone does not)
_RICH_METHODS = ("_repr_mimebundle_", *(name for name, _ in REPR_METHODS[:5]))


def _figure_png(obj: Any) -> str | None:
    """A matplotlib figure as base64 PNG (duck-typed: the runner imports no matplotlib)."""
    import base64
    import io

    buf = io.BytesIO()
    obj.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def is_figure(obj: Any) -> bool:
    """``obj`` looks like a matplotlib figure (it has a canvas and saves itself)."""
    return (not isinstance(obj, type) and callable(getattr(obj, "savefig", None))
            and hasattr(obj, "canvas"))


def has_rich_repr(obj: Any) -> bool:
    """``obj`` shows as more than text (a DataFrame, a figure, an object with
    ``_repr_html_``...): a cell's last value like that is displayed, as Jupyter does."""
    if isinstance(obj, type) or obj is None:
        return False
    return is_figure(obj) or any(callable(getattr(obj, name, None)) for name in _RICH_METHODS)


def plain_bundle(obj: Any, caps: DisplayCaps | None = None) -> dict[str, Any]:
    """The bundle of a plain value, the same on every backend: ``text/plain`` (its repr)
    and, when the value is JSON (within the item cap), ``application/json``."""
    data: dict[str, Any] = {"text/plain": repr(obj)}
    try:
        text = json.dumps(obj, allow_nan=False)
    except (TypeError, ValueError, RecursionError, OverflowError):
        return data
    if len(text) <= (caps or DisplayCaps()).item_bytes:
        value = json.loads(text)
        if not too_deep(value):
            data["application/json"] = value
    return data


def _call(obj: Any, name: str) -> Any:
    """What ``obj``'s method ``name`` gives, without its metadata (IPython's ``(data,
    metadata)``), or None when it has no such method or it fails."""
    method = getattr(obj, name, None)
    if not callable(method):
        return None
    try:
        got = method()
        return got[0] if isinstance(got, tuple) else got
    except Exception:
        return None


def _repr_content(obj: Any, name: str, mime: str) -> Any:
    """What ``obj``'s ``_repr_*_`` method ``name`` gives for ``mime`` in a bundle (bytes of an
    image as base64), or None when it has no such method, fails or gives the wrong type."""
    import base64

    got = _call(obj, name)
    if mime in SIGNATURES and isinstance(got, bytes):
        got = base64.b64encode(got).decode("ascii")
    return got if MIME_TYPES[mime] == "json" or isinstance(got, str) else None


def _bundle_data(obj: Any) -> dict[str, Any]:
    """The :data:`MIME_TYPES` in what ``obj``'s ``_repr_mimebundle_`` gives; none when it
    has no such method, fails or gives no dict."""
    got = _call(obj, "_repr_mimebundle_")
    try:
        return {k: v for k, v in got.items() if k in MIME_TYPES} if isinstance(got, dict) else {}
    except Exception:
        return {}


def _rich_data(obj: Any) -> dict[str, Any]:
    """The :data:`MIME_TYPES` an instance gives by IPython's conventions:
    ``_repr_mimebundle_``, then each ``_repr_*_`` method, a matplotlib figure as PNG."""
    data = _bundle_data(obj)
    for name, mime in REPR_METHODS:
        got = None if mime in data else _repr_content(obj, name, mime)
        if got is not None:
            data[mime] = got
    if "image/png" not in data and is_figure(obj):
        with contextlib.suppress(Exception):
            data["image/png"] = _figure_png(obj)
    return data


def _json_encodes(value: Any) -> bool:
    """Whether ``value`` encodes as JSON (no NaN or infinity)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _repr_text(obj: Any) -> str:
    """``obj``'s repr, or a note naming the exception its ``__repr__`` raised."""
    try:
        return repr(obj)
    except Exception as exc:
        return f"<repr failed: {type(exc).__name__}>"


def mime_bundle(obj: Any) -> dict[str, Any]:
    """The mime bundle of ``obj`` by IPython's conventions (``_repr_mimebundle_``, then the
    ``_repr_*_`` methods; a matplotlib figure as PNG), always with ``text/plain`` (its repr);
    a plain value gives :func:`plain_bundle`. Only :data:`MIME_TYPES` are kept; a method
    that fails or gives the wrong type is skipped, and JSON that does not encode is dropped."""
    if not has_rich_repr(obj) and not callable(getattr(obj, "_repr_json_", None)):
        return plain_bundle(obj)
    data = {} if isinstance(obj, type) else _rich_data(obj)
    if not _json_encodes(data.get("application/json")):
        del data["application/json"]
    if not isinstance(data.get("text/plain"), str):
        data["text/plain"] = _repr_text(obj)
    return data
