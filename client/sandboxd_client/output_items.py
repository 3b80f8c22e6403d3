"""A call's rich outputs and their place among its printed text (so that a reader sees each
where it happened):
:class:`Output` (a display item in Jupyter's mime-bundle convention), :class:`Position` and
:func:`in_order`, which :meth:`sandboxd_client.models.Result.sequence` uses; :func:`png_size`
for what a model reads of an image."""

from __future__ import annotations

import struct
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Position(_Model):
    """Where a display item happened (so that it can be shown in
    execution order): how many characters of the result's
    ``stdout`` and ``stderr`` had been written before it (Python string indices, i.e. Unicode
    code points; within the output cap)."""

    stdout: int = Field(default=0, ge=0)
    stderr: int = Field(default=0, ge=0)


class Output(_Model):
    """One rich output of a call, in Jupyter's mime-bundle convention: ``data``
    maps a MIME type to its content - text types (``text/plain``, ``text/html``,
    ``image/svg+xml``) as text, ``image/png`` as base64, ``application/json`` as JSON. A
    ``display(obj)`` call adds one; on the container backend so does every matplotlib figure
    a call leaves open. ``truncated``: the item was over the size cap, and its data is only a
    ``text/plain`` note that says so. ``at``: where in stdout and stderr it happened
    (:class:`Position`; None from a producer that does not say). Rules and caps:
    :mod:`sandboxd.results.outputs`."""

    type: Literal["display"] = "display"
    data: dict[str, Any]
    truncated: bool = False
    at: Position | None = None

    @property
    def image(self) -> tuple[str, str] | None:
        """``(MIME type, base64)`` of the item's raster image (PNG, else JPEG), if it has one:
        what ``Result.images()`` decodes and MCP hosts get as ``image`` content."""
        for mime in ("image/png", "image/jpeg"):
            if isinstance(self.data.get(mime), str):
                return mime, self.data[mime]
        return None


def png_size(png: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from a PNG's IHDR chunk, or ``None`` when it is not a PNG."""
    if len(png) < 24 or not png.startswith(b"\x89PNG\r\n\x1a\n") or png[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", png[16:24])
    return width, height


def in_order(stdout: str, stderr: str, outputs: list[Output]
             ) -> list[tuple[Literal["stdout", "stderr"], str] | Output]:
    """A result's text and display items in execution order (:meth:`Result.sequence`):
    the streams cut at each item's :attr:`Output.at`. Between two items
    stdout comes before stderr (the result keeps positions only at items; the stream's events
    keep every chunk's order); a position past the text (a cut output) is its end; items
    without a position (from an older daemon) go at the end."""
    parts: list[tuple[Literal["stdout", "stderr"], str] | Output] = []
    done = {"stdout": 0, "stderr": 0}
    texts: dict[Literal["stdout", "stderr"], str] = {"stdout": stdout, "stderr": stderr}

    def text_until(ends: dict[str, int]) -> None:
        for name, text in texts.items():
            end = min(max(ends[name], done[name]), len(text))
            if end > done[name]:
                parts.append((name, text[done[name]:end]))
                done[name] = end

    for item in outputs:
        if item.at is not None:
            text_until({"stdout": item.at.stdout, "stderr": item.at.stderr})
            parts.append(item)
    text_until({"stdout": len(stdout), "stderr": len(stderr)})
    return parts + [item for item in outputs if item.at is None]
