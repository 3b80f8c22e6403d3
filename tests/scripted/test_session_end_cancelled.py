"""A session's end runs to its end even when whoever ended it is cancelled half-way (a DELETE
whose task is cancelled, a revocation cut short): once unregistered the session is found by
nothing else that would end it, so its backends' sessions, its workspace and its audit record
must not depend on the caller waiting. The backend's close is held until the caller has been
cancelled; then it is let go, and the end is seen to finish on its own."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from sandboxd.backends.scripted import ScriptedBackend
from tests.support.wait import wait_until

from .test_service_on_scripted import make  # noqa: F401  (the fixture)


def test_an_end_whose_caller_is_cancelled_still_ends_the_session(  # type: ignore[no-untyped-def]
        make, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    d = make(ScriptedBackend())
    sid = d.client.post("/v1/sessions", json={}).json()["id"]
    session = next(s for s in d.service.sessions.registered() if s.id == sid)
    workspace = Path(session.workspace)
    backend = d.service.backends["restricted"]
    closing, let_go = threading.Event(), threading.Event()
    close = backend.close_session

    async def held_close(session_id: str) -> None:
        closing.set()
        await asyncio.to_thread(let_go.wait, 60)
        await close(session_id)

    monkeypatch.setattr(backend, "close_session", held_close)

    async def cancel_an_end() -> None:
        ender = asyncio.create_task(d.service.end_session(session, "session_deleted"))
        await asyncio.to_thread(closing.wait, 60)
        ender.cancel()
        with pytest.raises(asyncio.CancelledError):
            await ender

    assert d.client.portal is not None
    d.client.portal.call(cancel_an_end)
    assert d.client.get(f"/v1/sessions/{sid}").status_code == 404
    let_go.set()
    wait_until(lambda: [r for r in d.records() if r["event"] == "session_deleted"],
               timeout=60, what="the cancelled end's audit record")
    assert sid in backend.closed_sessions
    assert not workspace.exists(), "the session's workspace outlived its end"
