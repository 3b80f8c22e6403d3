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

A decoder made with ``direct_bytes`` reads a payload of at least that many bytes (its header
checked first, as any) into a buffer of its own, the size the header announced: the caller
reads into :meth:`Decoder.into` and reports what it read with :meth:`Decoder.filled` (a
kernel's pickled state, tens of MB, is then copied once, not three times).
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
        direct_bytes: int | None = None,
    ) -> None:
        self.sizes = dict(sizes)
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.direct_bytes = direct_bytes
        self.frames = 0
        self.total = 0
        self.buf = bytearray()
        self._need: tuple[bytes, int, int] | None = None  # header of the frame being read
        #: the payload being read into a buffer of its own (see ``direct_bytes``), and how
        #: much of it is there
        self._direct: bytearray | None = None
        self._got = 0

    @property
    def buffered(self) -> int:
        """Bytes held, waiting for the rest of a frame."""
        return len(self.buf)

    def _count(self, n: int) -> None:
        self.total += n
        if self.max_bytes is not None and self.total > self.max_bytes:
            raise ProtocolError(f"more than {self.max_bytes} bytes on the channel")

    def into(self) -> memoryview | None:
        """Where the next read may go: the unread rest of a payload read into its own buffer
        (see ``direct_bytes``), or None (read, then :meth:`feed`)."""
        if self._direct is None:
            return None
        return memoryview(self._direct)[self._got:]

    def filled(self, n: int) -> list[Frame]:
        """``n`` bytes were read into :meth:`into`'s view: the frame, once they complete it
        (raises :class:`ProtocolError` past the byte budget)."""
        direct = self._direct
        if direct is None or not 0 < n <= len(direct) - self._got:
            raise ValueError("filled() without a read into() its view")
        self._count(n)
        self._got += n
        return [self._finish_direct()] if self._got == len(direct) else []

    def _finish_direct(self) -> Frame:
        assert self._need is not None and self._direct is not None
        kind, call, _ = self._need
        frame = Frame(kind, call, self._direct)  # type: ignore[arg-type]  # (a bytearray)
        self._need, self._direct, self._got = None, None, 0
        return frame

    def _fill_direct(self, data: bytes | memoryview) -> tuple[list[Frame], int]:
        """Put what of ``data`` the payload read into its own buffer still lacks there: the
        frame once it is whole, and how many bytes of ``data`` it took."""
        assert self._direct is not None
        took = min(len(data), len(self._direct) - self._got)
        self._direct[self._got : self._got + took] = data[:took]
        self._got += took
        return ([self._finish_direct()] if self._got == len(self._direct) else []), took

    def feed(self, data: bytes) -> list[Frame]:
        """Add ``data`` and return the frames it completes (raises :class:`ProtocolError`)."""
        self._count(len(data))
        out: list[Frame] = []
        if self._direct is not None:
            out, took = self._fill_direct(data)
            data = data[took:]
            if not data:
                return out
        self.buf += data
        buf, pos = self.buf, 0
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
                    if self.direct_bytes is not None and size >= self.direct_bytes:
                        # its own buffer, of the size checked above; what is here goes in
                        self._direct = bytearray(size)
                        with memoryview(buf) as view:
                            done, took = self._fill_direct(view[pos : pos + size])
                        pos += took
                        if not done:
                            return out
                        out += done
                        continue
                kind, call, size = self._need
                if len(buf) - pos < size:
                    return out
                with memoryview(buf) as view, view[pos : pos + size] as payload:
                    out.append(Frame(kind, call, bytes(payload)))  # one copy, not two
                pos += size
                self._need = None
        finally:
            del buf[:pos]
