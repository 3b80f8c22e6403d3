"""A carried state is unpickled where it was received (:class:`.lang.carry._InPlace`, a
bytearray read straight from the socket by :func:`.zygote_protocol.recv_buffer`): the
unpickler reads from it exactly what it reads from ``io.BytesIO`` of the same bytes."""

from __future__ import annotations

import io
import pickle
import socket
import threading

import pytest

from sandboxd.backends.restricted.lang.carry import _InPlace
from sandboxd.backends.restricted.zygote_protocol import recv_buffer

VALUES = [
    {"blob": bytearray(range(256)) * 5000, "n": 3, "s": "text\nwith lines\n"},
    {"nested": [[1, 2.5, None], {"k": (b"x" * 70000, "y")}], "big": bytes(300_000)},
    {},
]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("value", VALUES, ids=["bytearray", "nested", "empty"])
def test_in_place_reads_what_bytesio_reads(protocol: int, value: dict[str, object]) -> None:
    data = pickle.dumps(value, protocol=protocol)
    expected = pickle.Unpickler(io.BytesIO(data)).load()
    assert pickle.Unpickler(_InPlace(bytearray(data))).load() == expected == value
    assert pickle.Unpickler(_InPlace(data)).load() == expected


def test_a_truncated_state_fails_as_with_bytesio() -> None:
    data = pickle.dumps(VALUES[0], protocol=5)[:-1000]
    for reader in (io.BytesIO(data), _InPlace(bytearray(data))):
        with pytest.raises((pickle.UnpicklingError, EOFError)):
            pickle.Unpickler(reader).load()


def test_recv_buffer_reads_the_whole_state_and_refuses_a_short_one() -> None:
    data = bytes(range(256)) * 20000
    ours, theirs = socket.socketpair()
    with ours, theirs:
        sender = threading.Thread(target=theirs.sendall, args=(data,))
        sender.start()
        assert recv_buffer(ours, len(data)) == data
        sender.join()
        theirs.sendall(b"abc")
        theirs.shutdown(socket.SHUT_WR)
        with pytest.raises(EOFError):
            recv_buffer(ours, 4)
