"""Streamed output (a caller sees a long call's progress): the events a call produces while it
runs.

A streaming caller puts an :data:`EventSink` on :attr:`Invocation.events
<sandboxd.models.Invocation.events>`. The backend calls it, on the event loop, as output
arrives from the sandbox: ``stdout``/``stderr`` with text (exactly the bytes that end up in
the result - within the output cap, decoded incrementally so no character is split) and
``display`` with an :class:`~sandboxd.results.items.Output` as a dict (its ``at``: the
characters of stdout and stderr sent before it, so events and the result agree on where it
sits). Events are sent in the order the sandbox produced them, so
that a reader sees text and displays where they happened. The service sends
the final ``result`` event itself. A sink must not block; it is never called after the call's result
exists. Over HTTP each event is one Server-Sent Event: ``event: <kind>`` and ``data:`` the
JSON of :meth:`StreamEvent.payload`.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

StreamKind = Literal["stdout", "stderr", "display", "result"]
#: every event kind, in the order a client may see them (output kinds interleave)
KINDS: tuple[StreamKind, ...] = ("stdout", "stderr", "display", "result")


@dataclass(frozen=True)
class StreamEvent:
    """One event of a streamed call. ``data``: text for ``stdout``/``stderr``; the display
    item (a dict) for ``display``; the result object (a dict) for ``result``."""

    kind: StreamKind
    data: str | dict[str, Any]

    def payload(self) -> dict[str, Any]:
        """The JSON object sent as the SSE ``data``: ``{"text": ...}`` for output chunks,
        the item or result itself otherwise."""
        if isinstance(self.data, str):
            return {"text": self.data}
        return self.data

    def output(self) -> str | None:
        """The text of an output chunk (``stdout`` or ``stderr``), else ``None``."""
        if self.kind in ("stdout", "stderr") and isinstance(self.data, str):
            return self.data
        return None


EventSink = Callable[[StreamEvent], None]


def emit(sink: EventSink | None, kind: StreamKind, data: str | dict[str, Any]) -> None:
    """Hand one event to ``sink`` when there is one (the one call site idiom of backends)."""
    if sink is not None and data:
        sink(StreamEvent(kind, data))


@dataclass
class TextRelay:
    """Hands a sandbox's stdout and stderr bytes to a sink as text, within one output budget
    for both (like the result's), decoded incrementally so that no character is split
    across events (the one relay of every backend's reader). It counts the characters of
    each stream so far, with or without a sink: :meth:`position` is where a display item
    sits in the result's ``stdout`` and ``stderr`` (so that a client can show them in
    execution order)."""

    sink: EventSink | None
    cap: int
    sent: int = 0
    chars: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    _decoders: dict[StreamKind, codecs.IncrementalDecoder] = field(default_factory=dict)

    def feed(self, kind: StreamKind, data: bytes) -> None:
        """Relay what of ``data`` fits in the budget."""
        data = data[: max(self.cap - self.sent, 0)]
        self.sent += len(data)
        if data:
            text = self._decoder(kind).decode(data)
            self.chars[kind] += len(text)
            emit(self.sink, kind, text)

    def position(self) -> dict[str, int]:
        """``{"stdout": n, "stderr": m}``: the characters of each stream relayed so far."""
        return dict(self.chars)

    def close(self) -> None:
        """Flush what a decoder holds (a character cut by the end of the output)."""
        for kind, decoder in self._decoders.items():
            text = decoder.decode(b"", final=True)
            self.chars[kind] += len(text)
            emit(self.sink, kind, text)
        self._decoders.clear()

    def _decoder(self, kind: StreamKind) -> codecs.IncrementalDecoder:
        if kind not in self._decoders:
            self._decoders[kind] = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return self._decoders[kind]
