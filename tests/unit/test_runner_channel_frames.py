"""The daemon's side of a container runner channel (sandboxd.backends.container.runner), fed
over a real socket pair by a peer that plays a compromised runner: display items are checked
per call against its caps, and a forged one breaks the channel (every call on it fails with
RunnerLost; the backend then removes the container)."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from sandboxd.backends.container.runner import CallOutput, Channel, RunnerLost
from sandboxd.protocol import wire
from sandboxd.protocol.call import WorkerReport, WorkerRequest
from sandboxd.protocol.display import DisplayCaps
from sandboxd.results.outputs import DisplayCollector
from sandboxd.results.streaming import StreamEvent
from tests.support.wait import async_wait_until

EXIT = json.dumps({"exit_code": 0}).encode()


async def _exchange(frames: list[tuple[bytes, bytes]], caps: DisplayCaps
                    ) -> tuple[CallOutput, BaseException | None, list[StreamEvent]]:
    """One call on a Channel whose runner answers with ``frames`` (call id 1)."""
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    channel = Channel(reader, writer)
    seen: list[StreamEvent] = []
    out = CallOutput(displays=DisplayCollector(caps), events=seen.append)
    call = asyncio.create_task(channel.call(WorkerRequest(kind="python", code="1"), 1 << 20, out))
    await async_wait_until(lambda: 1 in channel.calls, timeout=5, what="call 1 on the channel")
    theirs.sendall(b"".join(wire.encode(kind, payload, 1) for kind, payload in frames))
    error: BaseException | None = None
    try:
        await asyncio.wait_for(call, 5)
    except RunnerLost as exc:
        error = exc
    await channel.close()
    theirs.close()
    return out, error, seen


def test_good_items_are_collected_and_streamed_in_order() -> None:
    frames = [(b"d", b'{"data": {"text/plain": "one"}}'), (b"o", b"text"),
              (b"d", b'{"cut": {"mime": "image/png", "bytes": 9000000}}'), (b"x", EXIT)]
    out, error, seen = asyncio.run(_exchange(frames, DisplayCaps()))
    assert error is None and out.exit == WorkerReport(exit_code=0)
    assert [o.data["text/plain"] for o in out.displays.items] == [
        "one", "[display item cut: 9.0 MB image/png over the 2.1 MB cap]"]
    assert [(e.kind, e.data if e.kind == "stdout" else e.data["data"]["text/plain"][:5])
            for e in seen] == [("display", "one"), ("stdout", "text"), ("display", "[disp")]


@pytest.mark.parametrize("payload", [
    b'{"data": {"text/x-shellscript": "echo"}}',
    b'{"data": {"image/png": "aGVsbG8="}}',  # base64 of "hello": no PNG
    b"not json at all",
    b'{"data": {"text/plain": "' + b"x" * 5000 + b'"}}',  # over this call's frame cap
])
def test_a_forged_item_breaks_the_channel(payload: bytes) -> None:
    out, error, _ = asyncio.run(_exchange([(b"d", payload), (b"x", EXIT)],
                                          DisplayCaps(item_bytes=100, count=4)))
    assert isinstance(error, RunnerLost) and "display item" in str(error), error
    assert out.displays.items == [] and out.exit is None
