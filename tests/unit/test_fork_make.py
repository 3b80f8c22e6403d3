"""The forks of one request are made at once (:func:`sandboxd.fork.ops._make`): whatever
happens to one, every other ends before the fork's error is raised, and each one made is
handed to the caller's undo, in the order of the places asked for."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sandboxd.errors import SandboxdError
from sandboxd.fork import copy as fork_copy
from sandboxd.fork.ops import _make
from tests.support.wait import async_wait_until


class _Sessions:
    """Creations that copy (``fill``) and then succeed, fail or hang, by place."""

    def __init__(self, plan: list[str]) -> None:
        self.plan = plan
        self.ended: list[str] = []
        #: place i ends after place i + 1 has: they end in the reverse order of their places
        self.after = [asyncio.Event() for _ in plan]

    async def create(self, client: str, ttl: float, *, place: Any, fill: Any) -> Any:
        what = self.plan[place]
        try:
            await fill(Path(f"/w/{place}"), 1000 + place)
            if what == "fail":
                raise SandboxdError(f"place {place} failed")
            if what == "hang":
                await asyncio.Event().wait()
            if place + 1 < len(self.plan) and self.plan[place + 1] == "ok":
                await self.after[place + 1].wait()
            return SimpleNamespace(id=f"s{place}", workspace=f"/w/{place}")
        finally:
            self.ended.append(f"{place}:{what}")
            self.after[place].set()


def _service(plan: list[str]) -> Any:
    return SimpleNamespace(sessions=_Sessions(plan),
                           settings=SimpleNamespace(session_quota_entries=10))


def _parent() -> Any:
    return SimpleNamespace(workspace="/p", uid=999, quota_bytes=1, quota_entries=1, ttl_s=60)


@pytest.fixture(autouse=True)
def _no_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sandboxd.fork.ops.copy_workspace",
                        lambda src, dst, **kw: fork_copy.Copied(bytes=len(dst)))


def test_the_forks_come_in_the_order_asked_with_their_copies() -> None:
    service, children, copied = _service(["ok"] * 4), [], {}
    asyncio.run(_make(service, "c", _parent(), [0, 1, 2, 3], copied, children))
    assert service.sessions.ended == ["3:ok", "2:ok", "1:ok", "0:ok"]  # (made last first)
    assert [c.id for c in children] == ["s0", "s1", "s2", "s3"]
    assert sorted(copied) == ["/w/0", "/w/1", "/w/2", "/w/3"]


def test_one_failure_waits_for_the_others_and_hands_over_those_made() -> None:
    service, children = _service(["ok", "fail", "ok"]), []
    with pytest.raises(SandboxdError, match="place 1 failed"):
        asyncio.run(_make(service, "c", _parent(), [0, 1, 2], {}, children))
    assert sorted(service.sessions.ended) == ["0:ok", "1:fail", "2:ok"]
    assert [c.id for c in children] == ["s0", "s2"]


def test_a_cancelled_fork_cancels_and_waits_for_every_creation() -> None:
    service, children = _service(["ok", "hang", "hang"]), []

    async def main() -> None:
        task = asyncio.ensure_future(_make(service, "c", _parent(), [0, 1, 2], {}, children))
        await async_wait_until(lambda: "0:ok" in service.sessions.ended, timeout=30,
                               what="the first fork made")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert sorted(service.sessions.ended) == ["0:ok", "1:hang", "2:hang"]
    assert [c.id for c in children] == ["s0"]
