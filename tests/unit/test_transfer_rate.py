"""A slow upload must not hold a slot forever, on a real event loop: an upload's minimum rate and
time limit (:meth:`sandboxd.workspaces.transfer.Transfer.chunks`), and the per-client transfer
slots."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from sandboxd.scheduler import ClientPools, QueueFull
from sandboxd.workspaces.transfer import Transfer, UploadTimedOut, UploadTooSlow


async def _body(pieces: list[bytes], then_stall: bool) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece
    if then_stall:
        await asyncio.Event().wait()  # a client that sends nothing more


async def _receive(transfer: Transfer, deadline_s: float) -> list[bytes]:
    return [chunk async for chunk in transfer.chunks(time.monotonic() + deadline_s)]


async def test_a_fast_upload_passes_whole() -> None:
    transfer = Transfer("upload", _body([b"a" * 10, b"", b"b" * 5], False), min_rate=1 << 20,
                        grace_s=0.0)
    assert await _receive(transfer, 5) == [b"a" * 10, b"b" * 5]
    assert transfer.received == 15


async def test_under_the_minimum_rate_after_the_grace() -> None:
    # 100 bytes at 1000 bytes/s buy 0.1 s on top of the 0.2 s grace, then nothing comes
    transfer = Transfer("upload", _body([b"x" * 100], True), min_rate=1000, grace_s=0.2)
    began = time.monotonic()
    with pytest.raises(UploadTooSlow, match=r"minimum of 1000 bytes/s .*100 bytes came"):
        await _receive(transfer, 30)
    assert 0.3 <= time.monotonic() - began < 5


async def test_without_a_minimum_the_time_limit_ends_it() -> None:
    transfer = Transfer("upload", _body([b"x"], True), min_rate=0, grace_s=0.0)
    with pytest.raises(UploadTimedOut, match="time limit") as caught:
        await _receive(transfer, 0.2)
    assert not isinstance(caught.value, UploadTooSlow)


async def test_the_time_limit_comes_first_when_it_is_earlier() -> None:
    transfer = Transfer("upload", _body([], True), min_rate=1000, grace_s=60)
    with pytest.raises(UploadTimedOut, match="time limit"):
        await _receive(transfer, 0.2)


async def test_each_client_has_its_own_transfer_slots() -> None:
    pools = ClientPools(per_client=2, queue_size=0, queue_timeout_s=5)
    release = asyncio.Event()
    held = asyncio.Event()

    async def hold(client: str) -> None:
        async with pools.slot(client, time.monotonic() + 30):
            if pools.in_use == 2:
                held.set()
            await release.wait()

    holders = [asyncio.create_task(hold("alice")) for _ in range(2)]
    await held.wait()
    with pytest.raises(QueueFull, match="transfer slots of this client"):
        async with pools.slot("alice", time.monotonic() + 30):
            pass
    async with pools.slot("bob", time.monotonic() + 30):  # bob's are his own
        assert pools.in_use == 3
    release.set()
    await asyncio.gather(*holders)
    assert pools.in_use == 0 and pools._pools == {}  # idle pools are dropped
