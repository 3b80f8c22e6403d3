"""The frame format between the daemon and what runs sandboxed code, and its bounded decoder.

One definition for both channels and both sides: the restricted backend's worker socket
(daemon <-> confined worker, call id always 0) and the container backend's runner channel
(daemon <-> in-container runner, one channel per container, calls multiplexed by call id).
The in-container runner imports this very file (the image build copies it next to the runner),
so it must stay standard-library only and run on Python 3.11+.

A frame is ``kind`` (1 byte), ``call`` (4 bytes, big endian), ``length`` (4 bytes, big
endian), then ``length`` bytes of payload.

Whatever the sandbox side writes is written by an attacker who has read this code. The
:class:`Decoder` therefore never trusts a length before checking it: every kind has a payload
size range (an unknown kind, or a length outside its range, is a :class:`ProtocolError` as soon
as the header is seen, before any payload is buffered), and a decoder has a budget of frames
and bytes over its lifetime. The buffered bytes never exceed one header plus the largest
payload allowed. :meth:`Decoder.feed` does work proportional to the bytes it is given: callers
bound the bytes per call (one ``read`` of at most ``READ_BYTES``) to bound the work per read.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import NamedTuple

HEADER = struct.Struct(">cII")
#: the most bytes one read of a sandbox-written channel should take (and feed) at once
READ_BYTES = 65536


class ProtocolError(ValueError):
    """The peer broke the frame protocol: unknown kind, size out of range, over budget."""


class Frame(NamedTuple):
    """One decoded frame."""

    kind: bytes
    call: int
    payload: bytes


def encode(kind: bytes, payload: bytes, call: int = 0) -> bytes:
    """One frame, ready to send."""
    return HEADER.pack(kind, call, len(payload)) + payload


class Decoder:
    """Incremental, bounded frame decoder.

    ``sizes`` maps every allowed kind to its ``(min, max)`` payload length; ``max_frames`` and
    ``max_bytes`` (header bytes included) bound what the decoder accepts over its lifetime
    (``None``: unbounded, for a trusted peer).
    """

    def __init__(
        self,
        sizes: Mapping[bytes, tuple[int, int]],
        *,
        max_frames: int | None = None,
        max_bytes: int | None = None,
    ) -> None:
        self.sizes = dict(sizes)
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.frames = 0
        self.total = 0
        self.buf = bytearray()
        self._need: tuple[bytes, int, int] | None = None  # header of the frame being read

    @property
    def buffered(self) -> int:
        """Bytes held, waiting for the rest of a frame."""
        return len(self.buf)

    def feed(self, data: bytes) -> list[Frame]:
        """Add ``data`` and return the frames it completes (raises :class:`ProtocolError`)."""
        self.total += len(data)
        if self.max_bytes is not None and self.total > self.max_bytes:
            raise ProtocolError(f"more than {self.max_bytes} bytes on the channel")
        self.buf += data
        buf, pos = self.buf, 0
        out: list[Frame] = []
        try:
            while True:
                if self._need is None:
                    if len(buf) - pos < HEADER.size:
                        return out
                    kind, call, size = HEADER.unpack_from(buf, pos)
                    bounds = self.sizes.get(kind)
                    if bounds is None:
                        raise ProtocolError(f"unknown frame kind {kind!r}")
                    if not bounds[0] <= size <= bounds[1]:
                        raise ProtocolError(
                            f"frame {kind.decode('latin-1')!r} of {size} bytes "
                            f"(allowed: {bounds[0]}..{bounds[1]})"
                        )
                    self.frames += 1
                    if self.max_frames is not None and self.frames > self.max_frames:
                        raise ProtocolError(f"more than {self.max_frames} frames")
                    pos += HEADER.size
                    self._need = (kind, call, size)
                kind, call, size = self._need
                if len(buf) - pos < size:
                    return out
                with memoryview(buf) as view, view[pos : pos + size] as payload:
                    out.append(Frame(kind, call, bytes(payload)))  # one copy, not two
                pos += size
                self._need = None
        finally:
            del buf[:pos]
