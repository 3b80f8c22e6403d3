"""The scheduler on a real event loop: cap, fairness, bounded queue, deadlines, cancellation."""

from __future__ import annotations

import asyncio
import time

import pytest

from sandboxd.scheduler import DeadlineExpired, QueueFull, QueueTimeout, Scheduler


async def _work(s: Scheduler, client: str, log: list, running: list, peak: list,
                hold: float = 0.05) -> None:
    async with s.slot(client, time.monotonic() + 30):
        running.append(1)
        peak.append(len(running))
        log.append(client)
        await asyncio.sleep(hold)  # sleep-ok: a call that holds its slot ``hold`` s
        running.pop()


async def test_never_more_than_max_concurrency() -> None:
    s = Scheduler(max_concurrency=4, queue_size=64)
    log: list[str] = []
    running: list[int] = []
    peak: list[int] = []
    await asyncio.gather(*(_work(s, "a", log, running, peak) for _ in range(16)))
    assert max(peak) == 4
    assert len(log) == 16
    assert s.in_use == 0 and s.queued == 0


async def test_round_robin_between_clients() -> None:
    s = Scheduler(max_concurrency=1, queue_size=64)
    log: list[str] = []
    running: list[int] = []
    peak: list[int] = []
    blocker = asyncio.create_task(_work(s, "x", log, running, peak, hold=0.1))
    await asyncio.sleep(0.01)  # sleep-ok: orders coroutines: the tasks take their places
    # client a floods the queue first, b arrives later: b must not wait for all of a
    tasks = [asyncio.create_task(_work(s, "a", log, running, peak)) for _ in range(5)]
    await asyncio.sleep(0.01)  # sleep-ok: orders coroutines: the tasks take their places
    tasks += [asyncio.create_task(_work(s, "b", log, running, peak)) for _ in range(2)]
    await asyncio.gather(blocker, *tasks)
    order = log[1:]
    assert order[:4] == ["a", "b", "a", "b"], order


async def test_queue_full_raises_with_retry_after() -> None:
    s = Scheduler(max_concurrency=1, queue_size=2, per_client=2)
    release = asyncio.Event()

    async def hold() -> None:
        async with s.slot("c", time.monotonic() + 30):
            await release.wait()

    tasks = [asyncio.create_task(hold()) for _ in range(3)]  # 1 running + 2 queued
    await asyncio.sleep(0.01)  # sleep-ok: orders coroutines: the tasks take their places
    assert s.in_use == 1 and s.queued == 2
    with pytest.raises(QueueFull) as info:
        async with s.slot("c", time.monotonic() + 30):
            pass
    assert info.value.retry_after >= 1
    release.set()
    await asyncio.gather(*tasks)
    assert s.in_use == 0 and s.queued == 0


async def test_queue_timeout_and_deadline() -> None:
    s = Scheduler(max_concurrency=1, queue_size=8, queue_timeout_s=0.1)
    release = asyncio.Event()

    async def hold() -> None:
        async with s.slot("c", time.monotonic() + 30):
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0.01)  # sleep-ok: orders coroutines: the tasks take their places
    with pytest.raises(QueueTimeout):
        async with s.slot("c", time.monotonic() + 30):
            pass
    with pytest.raises(DeadlineExpired):  # the call's own deadline is shorter than the wait
        async with s.slot("c", time.monotonic() + 0.05):
            pass
    assert s.queued == 0
    release.set()
    await holder
    assert s.in_use == 0


async def test_cancelled_waiter_leaves_queue_and_slot_is_not_lost() -> None:
    s = Scheduler(max_concurrency=1, queue_size=8)
    release = asyncio.Event()

    async def hold() -> None:
        async with s.slot("c", time.monotonic() + 30):
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0.01)  # sleep-ok: orders coroutines: the tasks take their places
    waiter = asyncio.create_task(hold())
    await asyncio.sleep(0.01)  # sleep-ok: orders coroutines: the tasks take their places
    assert s.queued == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert s.queued == 0
    release.set()
    await holder
    assert s.in_use == 0
    async with s.slot("c", time.monotonic() + 1):  # the slot is usable again
        assert s.in_use == 1


async def test_a_slot_granted_as_its_waiter_is_cancelled_passes_on() -> None:
    """The holder leaves and the waiter is cancelled in the same loop step: the slot the
    waiter was just granted goes to the next waiter, never lost and never double-counted."""
    s = Scheduler(max_concurrency=1, queue_size=8)
    release = asyncio.Event()
    leave = asyncio.Event()

    async def hold(gate: asyncio.Event) -> None:
        async with s.slot("c", time.monotonic() + 30):
            await gate.wait()

    holder = asyncio.create_task(hold(leave))
    await asyncio.sleep(0.01)  # sleep-ok: orders coroutines: the tasks take their places
    doomed = asyncio.create_task(hold(release))
    await asyncio.sleep(0.01)  # sleep-ok: orders coroutines: the tasks take their places
    nxt = asyncio.create_task(hold(release))
    await asyncio.sleep(0.01)  # sleep-ok: orders coroutines: the tasks take their places
    assert (s.in_use, s.queued) == (1, 2)
    leave.set()
    await asyncio.sleep(0)  # the holder wakes, leaves and grants the slot to ``doomed``...
    await asyncio.sleep(0)
    doomed.cancel()  # ...which is cancelled before it could run
    with pytest.raises(asyncio.CancelledError):
        await doomed
    await holder
    await asyncio.sleep(0.01)  # sleep-ok: orders coroutines: the tasks take their places
    assert (s.in_use, s.queued) == (1, 0)  # ``nxt`` holds it
    release.set()
    await nxt
    assert (s.in_use, s.queued) == (0, 0)


async def _holders(s: Scheduler, release: asyncio.Event, client: str, n: int
                   ) -> list[asyncio.Task[None]]:
    async def hold() -> None:
        async with s.slot(client, time.monotonic() + 30):
            await release.wait()

    tasks = [asyncio.create_task(hold()) for _ in range(n)]
    await asyncio.sleep(0.01)  # sleep-ok: orders coroutines: the tasks take their places
    return tasks


async def test_one_client_holds_at_most_its_share_of_the_queue() -> None:
    s = Scheduler(max_concurrency=1, queue_size=8)  # per client: half the queue
    assert s.per_client == 4
    release = asyncio.Event()
    a = await _holders(s, release, "a", 5)  # 1 running + 4 queued
    assert s.in_use == 1 and s.queued == 4
    with pytest.raises(QueueFull, match="at most 4 per client"):
        async with s.slot("a", time.monotonic() + 30):
            pass
    b = await _holders(s, release, "b", 4)  # the other half is there for others
    assert s.queued == 8
    release.set()
    await asyncio.gather(*a, *b)
    assert s.in_use == 0 and s.queued == 0


async def test_a_client_with_nothing_queued_always_gets_a_place() -> None:
    s = Scheduler(max_concurrency=1, queue_size=4, per_client=4)
    release = asyncio.Event()
    a = await _holders(s, release, "a", 5)  # a fills every slot and the whole queue
    assert s.queued == 4
    b = await _holders(s, release, "b", 1)  # b takes a's newest place
    assert s.queued == 4
    pushed = [t for t in a if t.done()]
    assert len(pushed) == 1 and isinstance(pushed[0].exception(), QueueFull)
    assert "gave its place" in str(pushed[0].exception())
    c = await _holders(s, release, "c", 2)  # c: one place from a, then one more from a
    assert sum(t.done() for t in a) == 3 and s.queued == 4
    # now a, b and c hold 1, 1, 2: c cannot push anyone out (nobody holds more than c)
    with pytest.raises(QueueFull, match="queue is full"):
        async with s.slot("c", time.monotonic() + 30):
            pass
    release.set()
    await asyncio.gather(*b, *c)
    results = await asyncio.gather(*a, return_exceptions=True)
    assert sum(isinstance(r, QueueFull) for r in results) == 3
    assert s.in_use == 0 and s.queued == 0
