"""The daemon's runner endpoint (sandboxd.backends.container.runner.Endpoint) over a real unix
socket: ``close()`` always returns, whatever the peer was doing when it was called. A hello
that ended just as ``close()`` cancelled the accept loop used to be swallowed by 3.11's
``asyncio.wait_for``; the loop then waited forever for a peer that never came (a cancelled
container call hung in the VM job)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from sandboxd.backends.container.runner import KEY_BYTES, SOCKET_NAME, Endpoint
from sandboxd.protocol import wire
from sandboxd.util.deadline import within


async def _close_while_a_peer_says_hello(rundir: Path, spins: int, good_key: bool) -> bool:
    """Open an endpoint, let a peer connect and send a hello (with or without the key, then
    hang up when it has none), let the loop run ``spins`` steps, close: True if it returned."""
    ep = await Endpoint.open(rundir, None)
    loop = asyncio.get_running_loop()
    peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    peer.setblocking(False)
    try:
        await loop.sock_connect(peer, str(rundir / SOCKET_NAME))
        await loop.sock_sendall(peer, wire.encode(b"h", ep.key if good_key else
                                                  b"\0" * KEY_BYTES, 0))
        if not good_key:
            peer.close()
        for _ in range(spins):
            await asyncio.sleep(0)
        closing = asyncio.ensure_future(ep.close())
        done, _ = await asyncio.wait({closing}, timeout=5)  # (close may not heed a cancel)
    finally:
        peer.close()
    assert not done or not rundir.exists()
    return bool(done)


@pytest.mark.parametrize("good_key", [False, True])
def test_close_returns_at_every_point_of_a_hello(tmp_path: Path, good_key: bool) -> None:
    async def every_point() -> list[int]:
        return [spins for spins in range(16) for attempt in range(4)
                if not await _close_while_a_peer_says_hello(
                    tmp_path / f"e{spins}-{attempt}", spins, good_key)]

    assert asyncio.run(every_point()) == []


def test_a_keyless_peer_is_refused_and_the_runner_still_gets_in(tmp_path: Path) -> None:
    async def scenario() -> tuple[bool, bool]:
        ep = await Endpoint.open(tmp_path / "e", None)
        loop = asyncio.get_running_loop()
        stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stranger.setblocking(False)
        await loop.sock_connect(stranger, str(ep.rundir / SOCKET_NAME))
        await loop.sock_sendall(stranger, wire.encode(b"h", b"\1" * KEY_BYTES, 0))
        refused = await loop.sock_recv(stranger, 1) == b""  # hung up on
        stranger.close()
        runner = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        runner.setblocking(False)
        await loop.sock_connect(runner, str(ep.rundir / SOCKET_NAME))
        await loop.sock_sendall(runner, wire.encode(b"h", ep.key, 0))
        await within(ep.settled.wait(), 5)
        ready = ep.ready and not (ep.rundir / SOCKET_NAME).exists()
        await ep.close()
        runner.close()
        return refused, ready

    assert asyncio.run(scenario()) == (True, True)
