"""The display-item rules (sandboxd.protocol.display, sandboxd.results.outputs): what a sandbox may
send."""

from __future__ import annotations

import base64
import json
import struct
import zlib

import pytest

from sandboxd.protocol.display import DisplayCaps, encode_item
from sandboxd.protocol.wire import ProtocolError
from sandboxd.results.outputs import DisplayCollector, check_item
from sandboxd_client.output_items import png_size


def tiny_png(width: int = 3, height: int = 2) -> bytes:
    """A real PNG (one grey pixel row per line), built by hand."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    raw = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0,
                                                            0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


CAPS = DisplayCaps(item_bytes=4096, count=3)


def frame(data: object) -> bytes:
    return json.dumps(data).encode()


def test_a_good_item_passes_with_every_allowed_kind_of_content() -> None:
    png = base64.b64encode(tiny_png()).decode()
    item = check_item(frame({"data": {"text/plain": "x", "text/html": "<b>x</b>",
                                      "image/png": png, "application/json": {"a": [1]}}}), CAPS)
    assert item.type == "display" and not item.truncated
    assert item.data["image/png"] == png and item.data["application/json"] == {"a": [1]}


@pytest.mark.parametrize("payload", [
    b"not json",
    frame([1, 2]),
    frame({"data": {}}),
    frame({"data": {"text/plain": "x"}, "extra": 1}),
    frame({"data": {"application/x-evil": "x"}}),
    frame({"data": {"text/plain": 5}}),
    frame({"data": {"image/png": "!!!not base64!!!"}}),
    frame({"data": {"image/png": base64.b64encode(b"GIF89a....").decode()}}),
    frame({"data": {"image/jpeg": base64.b64encode(tiny_png()).decode()}}),
    frame({"cut": {"mime": "text/plain", "bytes": -1}}),
    frame({"cut": {"mime": "application/x-evil", "bytes": 10}}),
    frame({"cut": {"mime": "image/png", "bytes": True}}),
    b"[" * 100_000 + b"]" * 100_000,
])
def test_malformed_items_are_protocol_violations(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        check_item(payload, DisplayCaps(item_bytes=1 << 20))


def test_an_oversized_frame_is_a_violation_and_a_cut_record_becomes_a_note() -> None:
    with pytest.raises(ProtocolError):
        check_item(frame({"data": {"text/plain": "x" * 10_000}}), CAPS)
    note = check_item(frame({"cut": {"mime": "image/png", "bytes": 3_100_000}}), CAPS)
    assert note.truncated is True
    assert note.data == {"text/plain": "[display item cut: 3.1 MB image/png over the 4.1 KB "
                                       "cap]"}


def test_the_sender_cuts_what_the_daemon_would_refuse() -> None:
    big = {"text/plain": "y" * 10_000}
    payload = encode_item(big, CAPS)
    assert json.loads(payload) == {"cut": {"mime": "text/plain",
                                           "bytes": len(json.dumps({"data": big}))}}
    assert check_item(payload, CAPS).truncated
    small = {"text/plain": "ok"}
    assert check_item(encode_item(small, CAPS), CAPS).data == small


def test_the_count_cap_keeps_one_note_and_drops_the_rest() -> None:
    collector = DisplayCollector(CAPS)
    taken = [collector.take(frame({"data": {"text/plain": str(i)}})) for i in range(6)]
    assert [t is not None for t in taken] == [True, True, True, True, False, False]
    assert [i.data["text/plain"] for i in collector.items[:3]] == ["0", "1", "2"]
    assert collector.items[3].truncated and "at most 3" in collector.items[3].data["text/plain"]


def test_png_size_reads_the_header() -> None:
    assert png_size(tiny_png(640, 480)) == (640, 480)
    assert png_size(b"GIF89a" + b"\0" * 30) is None


def test_what_a_model_and_an_mcp_host_get_of_an_image() -> None:
    from sandboxd.api.mcp.results import call_result
    from sandboxd.models import Reason, Result
    from sandboxd.results.items import Output
    from sandboxd_client.render import format_result

    png = tiny_png(640, 480)
    result = Result.build(("inv_1", "python", None), "container", Reason.exited, exit_code=0,
                          stdout="plotted\n")
    result.outputs = [
        Output(data={"text/plain": "<Figure size 640x480 with 1 Axes>",
                     "image/png": base64.b64encode(png).decode()}),
        Output(data={"text/html": "<table/>", "text/plain": "   a\n0  1"}),
    ]
    assert result.images() == [png]
    assert format_result(result) == ("stdout:\nplotted\ndisplay:\n[image: 640x480 png]\n"
                                     "   a\n0  1")
    content = call_result(result).content  # each image after the text naming it, in order
    assert [c.type for c in content] == ["text", "image", "text"]
    assert content[0].text == "stdout:\nplotted\ndisplay:\n[image: 640x480 png]"
    assert content[1].mime_type == "image/png" and base64.b64decode(content[1].data) == png
    assert content[2].text == "   a\n0  1"


@pytest.mark.parametrize("value", [41, 2.5, "text", [1, {"a": None}], {"k": True}, None,
                                   float("nan"), {1, 2}, b"bytes", ("t", 1)])
def test_plain_values_make_the_same_bundle_on_every_backend(value: object) -> None:
    """The restricted backend's display() sends plain_bundle; the container runner's sends
    mime_bundle: for plain values they are one rule."""
    from sandboxd.protocol.display import mime_bundle, plain_bundle

    assert mime_bundle(value) == plain_bundle(value)
    assert plain_bundle(value)["text/plain"] == repr(value)


def test_a_rich_last_value_reaches_the_model_once() -> None:
    """A regression: a DataFrame as the last value came back as the value (its repr) and as a
    display item, and the model read it twice; a plain value still reads as the value."""
    from sandboxd.models import Reason, Result
    from sandboxd.results.items import Output
    from sandboxd_client.render import format_result

    table = "   a\n0  1"
    result = Result.build(("inv_1", "python", None), "container", Reason.exited, exit_code=0)
    result.value = table
    result.outputs = [Output(data={"text/html": "<table/>", "text/plain": table})]
    assert format_result(result) == "display:\n" + table
    result.value = 42
    assert format_result(result) == "display:\n" + table + "\nvalue: 42"  # the value last
