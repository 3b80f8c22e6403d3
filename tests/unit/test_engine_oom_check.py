"""The container backend's OOM check waits for the engine when the runner vanished (the VM
once saw the kernel kill the runner in a second OOM kill right after the call's process; the
engine had not handled the OOM event yet when it was asked at once, so a call that hit its
memory limit read as a lost runner). The engine is a stub here: the kernel race cannot be
made to happen on demand; tests/container runs the real memory limits."""

from __future__ import annotations

from typing import Any

import pytest

from sandboxd.backends.container import engine


class _Client:
    def __init__(self, states: list[dict[str, Any]]) -> None:
        self.states = states
        self.asked = 0

    def inspect_container(self, cid: str) -> dict[str, Any]:
        state = self.states[min(self.asked, len(self.states) - 1)]
        self.asked += 1
        return {"State": state}


RUNNING = {"Running": True, "OOMKilled": False}
STOPPED_OOM = {"Running": False, "OOMKilled": True, "ExitCode": 137}
STOPPED = {"Running": False, "OOMKilled": False, "ExitCode": 137}


def test_a_lost_runner_waits_for_the_engine_to_see_the_stop() -> None:
    client = _Client([RUNNING, RUNNING, RUNNING, STOPPED_OOM])
    assert engine.oom_killed(client, "c", runner_lost=True) is True  # type: ignore[arg-type]
    assert client.asked == 4


def test_a_stop_without_oom_is_no_oom_after_the_grace() -> None:
    client = _Client([RUNNING, STOPPED])
    assert engine.oom_killed(client, "c", runner_lost=True) is False  # type: ignore[arg-type]
    polls = engine.OOM_EVENT_GRACE_S / 0.05
    assert polls / 2 < client.asked < polls * 4  # the grace, not the whole settle time


def test_an_oom_mark_after_the_stop_is_still_seen() -> None:
    """The engine's OOM event may come after its stop event (the VM job, cgroup v2: a memory
    bomb in a shell command once read as "the sandbox runner went away")."""
    client = _Client([RUNNING, STOPPED, STOPPED, STOPPED, STOPPED_OOM])
    assert engine.oom_killed(client, "c", runner_lost=True) is True  # type: ignore[arg-type]


def test_without_a_lost_runner_the_engine_is_asked_once() -> None:
    client = _Client([RUNNING, STOPPED_OOM])
    assert engine.oom_killed(client, "c") is False  # type: ignore[arg-type]
    assert client.asked == 1


def test_the_wait_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "OOM_SETTLE_S", 0.2)
    client = _Client([RUNNING])
    assert engine.oom_killed(client, "c", runner_lost=True) is False  # type: ignore[arg-type]
    assert 2 <= client.asked <= 10
