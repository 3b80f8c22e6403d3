"""Display items (issue 14): the rules both sides share - the sandbox that sends them (the
restricted worker's ``display``, the container runner's) and the daemon that checks them
(:mod:`sandboxd.outputs`). Standard library only: the image build copies this file next to
the container runner, like :mod:`sandboxd.wire` and :mod:`sandboxd.rules`.

A sandbox sends each item as one ``d`` frame whose payload is JSON:

* ``{"data": {MIME: content, ...}}`` - an item, in Jupyter's mime-bundle convention; or
* ``{"cut": {"mime": MIME, "bytes": N}}`` - an item the sandbox found over
  :attr:`DisplayCaps.item_bytes` and did not send; the daemon turns it into a ``text/plain``
  note saying so.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class DisplayCaps:
    """How much one call may display: ``item_bytes`` per item (the JSON of its data, images as
    base64), ``count`` items per call (settings ``max_display_bytes`` / ``max_displays``)."""

    item_bytes: int = 2 * 1024 * 1024
    count: int = 32

    @property
    def frame_bytes(self) -> int:
        """The largest ``d`` frame payload the daemon accepts: a well-behaved sandbox cuts an
        item by the size of its JSON, so this is the cap plus slack."""
        return self.item_bytes + FRAME_SLACK

    def wire(self) -> dict[str, int]:
        """The caps as sent to a sandbox (its ``display`` cuts items by them)."""
        return {"item_bytes": self.item_bytes, "count": self.count}


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
