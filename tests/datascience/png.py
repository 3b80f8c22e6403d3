"""A strict reader of the PNG files a sandbox writes back (hostile input: every length and
CRC checked, sizes bounded), enough to tell that a plot decodes: the header, the image size,
and pixel data that inflates to exactly the size the header promises."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_SIDE = 16384
#: samples per pixel of each colour type (8-bit or 16-bit samples)
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


class BadPNG(ValueError):
    """The bytes are not a well-formed PNG image."""


@dataclass(frozen=True)
class Decoded:
    """What the checks read from a PNG."""

    width: int
    height: int
    color_type: int
    bit_depth: int
    rows: list[bytes]  # each scanline without its filter byte (still filtered)

    def distinct_bytes(self) -> int:
        """How many different byte values the scanlines hold (a blank image has very few)."""
        seen: set[int] = set()
        for row in self.rows:
            seen.update(row)
        return len(seen)


def decode(data: bytes) -> Decoded:
    """Check ``data`` chunk by chunk and inflate its IDAT stream; raise :class:`BadPNG`."""
    if not data.startswith(SIGNATURE):
        raise BadPNG("no PNG signature")
    pos, header, idat, ended = len(SIGNATURE), None, bytearray(), False
    while pos < len(data):
        if pos + 12 > len(data):
            raise BadPNG("truncated chunk")
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if len(body) != length or pos + 12 + length > len(data):
            raise BadPNG(f"chunk {kind!r} runs past the end")
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) != crc:
            raise BadPNG(f"bad CRC in chunk {kind!r}")
        pos += 12 + length
        if header is None and kind != b"IHDR":
            raise BadPNG("the first chunk is not IHDR")
        if kind == b"IHDR":
            if length != 13 or header is not None:
                raise BadPNG("bad IHDR")
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            ended = True
            break
    if header is None or not ended or not idat:
        raise BadPNG("missing IHDR, IDAT or IEND")
    width, height, depth, color, _compression, _filter, interlace = header
    if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):
        raise BadPNG(f"implausible size {width}x{height}")
    if color not in CHANNELS or depth not in (8, 16) or interlace != 0:
        raise BadPNG(f"unexpected format (colour type {color}, depth {depth}, "
                     f"interlace {interlace})")
    stride = (width * CHANNELS[color] * depth + 7) // 8
    inflater = zlib.decompressobj()
    raw = inflater.decompress(bytes(idat), height * (stride + 1) + 1)
    if not inflater.eof or len(raw) != height * (stride + 1):
        raise BadPNG(f"pixel data inflates to {len(raw)} bytes, not {height * (stride + 1)}")
    rows = []
    for y in range(height):
        line = raw[y * (stride + 1):(y + 1) * (stride + 1)]
        if line[0] > 4:
            raise BadPNG(f"row {y}: unknown filter {line[0]}")
        rows.append(line[1:])
    return Decoded(width, height, color, depth, rows)
