"""Rich outputs (images, HTML, tables a call displays): the one definition of what a display
item may be.

A call adds display items with ``display(obj)`` (and, on the container backend, by leaving a
matplotlib figure open); the sandbox sends each as one ``d`` frame
(:mod:`sandboxd.protocol.display`:
the frame's shape, the MIME types, the caps).

Everything in a ``d`` frame was written by code that may have escaped its language layer:
:func:`check_item` accepts only known MIME types with content of the right shape (text as
text, images as base64 that decodes to the format's signature, JSON as JSON), and only within
the caps; anything else is a
:class:`~sandboxd.protocol.wire.ProtocolError`, which ends the call like
any other malformed frame. Both backends' daemon-side readers use it.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from sandboxd.protocol.display import (
    MIME_TYPES,
    SIGNATURES,
    TOO_DEEP,
    DisplayCaps,
    size_text,
    too_deep,
)
from sandboxd.protocol.wire import ProtocolError
from sandboxd.results.items import Output

__all__ = ["DisplayCaps", "DisplayCollector", "check_item", "count_note", "cut_note"]

def cut_note(mime: str, size: int, caps: DisplayCaps) -> Output:
    """The item that stands for one over the cap."""
    return Output(data={"text/plain": f"[display item cut: {size_text(size)} {mime} over the "
                                      f"{size_text(caps.item_bytes)} cap]"}, truncated=True)


def count_note(caps: DisplayCaps) -> Output:
    """The item that says a call's further items were dropped."""
    return Output(data={"text/plain": f"[further display items cut: at most {caps.count} per "
                                      "call]"}, truncated=True)


def _check_content(mime: str, value: Any) -> None:
    carried = MIME_TYPES.get(mime)
    if carried is None:
        raise ProtocolError(f"display item: MIME type {mime[:40]!r} is not allowed")
    if carried == "json":
        return  # any JSON value (it was parsed from JSON)
    if not isinstance(value, str):
        raise ProtocolError(f"display item: {mime} content is not a string")
    if carried == "base64":
        _check_image(mime, value)


def _check_image(mime: str, value: str) -> None:
    """An image's content: base64 that decodes to bytes starting with its format's
    signature."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(f"display item: {mime} content is not base64") from None
    if not raw.startswith(SIGNATURES[mime]):
        raise ProtocolError(f"display item: {mime} content is not a {mime} image")


def _cut_record(cut: object) -> tuple[str, int]:
    """The MIME type and size of an item the sandbox cut (``{"cut": {"mime", "bytes"}}``)."""
    if not (isinstance(cut, dict) and set(cut) == {"mime", "bytes"}):
        raise ProtocolError("display item: a malformed cut record")
    mime, size = cut["mime"], cut["bytes"]
    if not (isinstance(mime, str) and mime in MIME_TYPES and isinstance(size, int)
            and not isinstance(size, bool) and 0 <= size < 2**63):
        raise ProtocolError("display item: a malformed cut record")
    return mime, size


def _one_member(payload: bytes, caps: DisplayCaps) -> dict[str, Any]:
    """The JSON object of one member a ``d`` frame must carry, within the frame cap."""
    if len(payload) > caps.frame_bytes:
        raise ProtocolError("display item: over the frame cap")
    try:
        item = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"display item: not JSON ({type(exc).__name__})") from None
    if not isinstance(item, dict) or len(item) != 1:
        raise ProtocolError("display item: not an object with one member")
    return item


def _data_output(data: object) -> Output:
    """The :class:`Output` of an item's ``data`` (MIME type to content), each content
    checked."""
    if not isinstance(data, dict) or not data:
        raise ProtocolError("display item: no data")
    for mime, value in data.items():
        _check_content(mime, value)
    return _bounded(data)


def _bounded(data: dict[str, Any]) -> Output:
    """The :class:`Output` of checked ``data``, bounded where the daemon accepts it: JSON
    nested too deep is left out and the rest kept (a note when nothing is left)."""
    deep = [mime for mime, value in data.items() if MIME_TYPES[mime] == "json" and too_deep(value)]
    if not deep:
        return Output(data=data)
    kept = {m: v for m, v in data.items() if m not in deep} or {
        "text/plain": f"[display item cut: {TOO_DEEP}]"}
    return Output(data=kept, truncated=True)


def check_item(payload: bytes, caps: DisplayCaps) -> Output:
    """The :class:`Output` a ``d`` frame stands for, validated (raises
    :class:`ProtocolError`)."""
    item = _one_member(payload, caps)
    if "cut" in item:
        return cut_note(*_cut_record(item["cut"]), caps)
    return _data_output(item.get("data"))


class DisplayCollector:
    """One call's display items, in order, within the count cap (a daemon-side reader owns
    one). :meth:`take` validates a frame's payload; past the count it keeps one note."""

    def __init__(self, caps: DisplayCaps) -> None:
        self.caps = caps
        self.items: list[Output] = []
        self.dropped = False

    def take(self, payload: bytes) -> Output | None:
        """The accepted item (``None`` past the count cap; raises :class:`ProtocolError`)."""
        item = check_item(payload, self.caps)
        if len(self.items) >= self.caps.count:
            if self.dropped:
                return None
            self.dropped = True
            item = count_note(self.caps)
        self.items.append(item)
        return item

