"""The frame decoder's direct reads (:mod:`sandboxd.protocol.wire`, ``direct_bytes``): a large
payload is read straight into a buffer of its own, and that changes nothing of what the
decoder accepts, refuses or returns. Each stream is decoded twice, by ``feed`` alone (the
reference) and by a reader that uses :meth:`Decoder.into` whenever it is offered, cut at
every size, and the two must agree frame for frame and error for error."""

from __future__ import annotations

import random

import pytest

from sandboxd.protocol.wire import HEADER, Decoder, Frame, ProtocolError, encode

SIZES = {b"o": (1, 64), b"s": (0, 4096), b"r": (2, 100)}


def _feed_only(stream: bytes, step: int, **bounds: int) -> list[Frame] | str:
    decoder = Decoder(SIZES, **bounds)
    out: list[Frame] = []
    try:
        for i in range(0, len(stream), step):
            out += decoder.feed(stream[i : i + step])
    except ProtocolError as exc:
        return str(exc)
    return out


def _direct(stream: bytes, step: int, **bounds: int) -> list[Frame] | str:
    """What a reader that reads into the decoder's buffer when it may gets, reading at most
    ``step`` bytes at a time (as a socket hands them over)."""
    decoder = Decoder(SIZES, direct_bytes=100, **bounds)
    out: list[Frame] = []
    pos = 0
    try:
        while pos < len(stream):
            into = decoder.into()
            if into is None:
                out += decoder.feed(stream[pos : pos + step])
                pos += step
                continue
            n = min(step, len(into), len(stream) - pos)
            into[:n] = stream[pos : pos + n]
            pos += n
            out += decoder.filled(n)
    except ProtocolError as exc:
        return str(exc)
    return out


def _stream(rnd: random.Random) -> bytes:
    frames = []
    for _ in range(rnd.randint(1, 6)):
        kind = rnd.choice([b"o", b"s", b"s", b"r"])
        low, high = SIZES[kind]
        frames.append(encode(kind, rnd.randbytes(rnd.randint(low, high))))
    return b"".join(frames)


@pytest.mark.parametrize("seed", range(30))
def test_direct_reads_return_what_feeding_returns(seed: int) -> None:
    rnd = random.Random(seed)
    stream = _stream(rnd)
    for step in (1, 7, 99, 100, 101, 4096, len(stream)):
        reference = _feed_only(stream, step)
        assert isinstance(reference, list)
        got = _direct(stream, step)
        assert got == reference, step
        assert [bytes(f.payload) for f in got] == [bytes(f.payload) for f in reference]


@pytest.mark.parametrize("seed", range(30))
def test_direct_reads_keep_the_byte_and_frame_budgets(seed: int) -> None:
    """A stream over the decoder's lifetime budgets is refused at the same frame either way:
    the bytes read into the decoder's buffer are counted as fed ones are."""
    rnd = random.Random(seed)
    stream = _stream(rnd)
    bounds = {"max_bytes": rnd.randint(1, len(stream)), "max_frames": rnd.randint(1, 4)}
    for step in (1, 13, 256, len(stream)):
        reference = _feed_only(stream, step, **bounds)
        got = _direct(stream, step, **bounds)
        if isinstance(reference, str):
            assert got == reference, (step, bounds)
        else:
            assert got == reference


def test_a_large_length_is_refused_before_any_buffer_is_made() -> None:
    """The header's length is checked against the kind's range first: a state frame that
    claims more than its maximum makes no buffer of that size."""
    decoder = Decoder(SIZES, direct_bytes=100)
    with pytest.raises(ProtocolError, match=r"allowed: 0\.\.4096"):
        decoder.feed(HEADER.pack(b"s", 0, 1 << 31))
    assert decoder.into() is None and decoder.buffered <= HEADER.size


def test_filled_refuses_more_than_it_was_offered() -> None:
    decoder = Decoder(SIZES, direct_bytes=100)
    assert decoder.feed(HEADER.pack(b"s", 0, 200) + b"x" * 50) == []
    into = decoder.into()
    assert into is not None and len(into) == 150
    with pytest.raises(ValueError):
        decoder.filled(151)
    into[:150] = b"y" * 150
    (frame,) = decoder.filled(150)
    assert frame.payload == b"x" * 50 + b"y" * 150 and decoder.into() is None
    with pytest.raises(ValueError):
        decoder.filled(1)
