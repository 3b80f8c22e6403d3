"""A call in a session slides its expiry (without a file write per call): the session
file is rewritten only when
the expiry passes the one it holds, written ahead by TOUCH_AHEAD_S; a daemon that crashes
and restarts recovers the session expiring no earlier than the live one would have, and at
most TOUCH_AHEAD_S later."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from sandboxd.sessions import manager as sessions_module
from sandboxd.sessions.manager import TOUCH_AHEAD_S, SessionManager


def manager(state: Path) -> SessionManager:
    m = SessionManager(state, ttl_s=3600, quota_bytes=1 << 20, max_per_client=4, uids=None,
                       quota_mode="advisory")
    m.sweep()
    return m


async def test_touch_saves_the_expiry_ahead_and_not_on_every_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_000_000.0]
    monkeypatch.setattr(sessions_module, "time", types.SimpleNamespace(time=lambda: clock[0]))
    m = manager(tmp_path)
    session = await m.create("alice")
    meta = tmp_path / "sessions" / f"{session.id}.json"

    def saved() -> float:
        return float(json.loads(meta.read_text())["expires_at"])

    # the file holds the expiry ahead from the session's creation: its first call's touch
    # writes nothing
    first = meta.read_bytes()
    assert saved() == session.expires_at + TOUCH_AHEAD_S
    clock[0] += 5
    m.touch(session)
    assert session.expires_at == clock[0] + 3600
    assert meta.read_bytes() == first
    # another write of the file (its live kernels) keeps the expiry it holds ahead
    session.kernels_live = ["restricted"]
    m.save(session)
    first = meta.read_bytes()
    assert saved() == session.expires_at - 5 + TOUCH_AHEAD_S
    for _ in range(10):  # calls within the slack: the file is not rewritten
        clock[0] += TOUCH_AHEAD_S / 20
        m.touch(session)
        assert meta.read_bytes() == first
        assert session.expires_at <= saved() <= session.expires_at + TOUCH_AHEAD_S
    clock[0] += TOUCH_AHEAD_S  # past it: rewritten, ahead again
    m.touch(session)
    assert saved() == session.expires_at + TOUCH_AHEAD_S

    # a crash now (nothing saved at stop): the next daemon recovers the session from its
    # file, expiring no earlier than the live one, at most TOUCH_AHEAD_S later
    clock[0] += 1
    m.touch(session)
    again = manager(tmp_path)
    recovered = again.get(session.id, "alice")
    assert session.expires_at <= recovered.expires_at <= session.expires_at + TOUCH_AHEAD_S


async def test_a_short_ttl_is_saved_at_most_a_tenth_ahead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_000_000.0]
    monkeypatch.setattr(sessions_module, "time", types.SimpleNamespace(time=lambda: clock[0]))
    m = manager(tmp_path)
    session = await m.create("alice", ttl_s=100)
    meta = tmp_path / "sessions" / f"{session.id}.json"
    assert json.loads(meta.read_text())["expires_at"] == session.expires_at + 10
    clock[0] += 11  # past what the file holds: the touch writes it, a tenth ahead again
    m.touch(session)
    assert json.loads(meta.read_text())["expires_at"] == session.expires_at + 10
