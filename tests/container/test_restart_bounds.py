"""Start and stop are bounded whatever sandboxes do (restarts keep sessions, container
backend): session code that stops its own runner (SIGSTOP) after a clean stop cannot hold the
next start. The daemon serves while it re-adopts the kept containers (all at once, within
``adopt_timeout_s``); a call of a session whose runner came back does not wait for the others;
a call of a stopped runner's session waits for the round's bound and says its kernel was lost.
Each kept record is consumed as it is tried: a start killed meanwhile does not wait for it
again. At a stop, runners that cannot answer the suspend are waited for at once, not one after
another."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, uid_range_env
from tests.support.wait import wait_until

from .conftest import labelled
from .test_http import SLOW_ENGINE, daemon_env, policies  # noqa: F401  (a fixture)
from .test_restart_sessions import (  # noqa: F401  (fixtures)
    _by_session,
    _delete_and_stop,
    _empty,
    _session,
    _start,
    daemons,
    instance,
    state,
)

pytestmark = [pytest.mark.docker, pytest.mark.same_on_every_host(
    "the bounds of re-adoption and suspension are the daemon's own logic on the same engine; "
    "the VM's service job checks a start and a stop with stopped runners under the shipped "
    "unit (start-with-stopped-runners-bounded, stop-with-unread-answer-bounded)")]

#: the start's re-adoption bound in these tests: far above a daemon start on the host (its
#: readiness is checked before the round can have ended), far below 15 s per stopped runner
ADOPT_S = 30.0


def _runner(container: Any) -> psutil.Process:
    """The runner process of a session container (the child of its init), seen from the
    host."""
    container.reload()
    init = psutil.Process(container.attrs["State"]["Pid"])
    found = [p for p in init.children() if "runner.py" in " ".join(p.cmdline())]
    assert len(found) == 1, [p.cmdline() for p in init.children()]
    return found[0]


def _env(instance: str) -> dict[str, str]:  # noqa: F811
    return {**daemon_env(instance), "SANDBOXD_SESSIONS_SURVIVE_RESTART": "true",
            "SANDBOXD_ADOPT_TIMEOUT_S": str(ADOPT_S), **uid_range_env()}


def _stop_runners(docker_client: Any, instance: str, sids: list[str]) -> None:  # noqa: F811
    kept = _by_session(docker_client, instance)
    for sid in sids:
        _runner(kept[sid]).send_signal(signal.SIGSTOP)


def test_a_start_serves_while_stopped_runners_are_adopted_and_says_their_kernels_lost(
        docker_client: Any, tmp_path: Path, policies: Path, state: Path,  # noqa: F811
        instance: str, daemons: list[RunningDaemon]) -> None:  # noqa: F811
    env = _env(instance)
    first = _start(tmp_path, state, env, policies, daemons)
    sound, frozen, other = _session(first), _session(first), _session(first)
    assert first.stop() == 0
    kept = _by_session(docker_client, instance)
    _stop_runners(docker_client, instance, [frozen, other])
    started = time.monotonic()
    second = _start(tmp_path, state, env, policies, daemons)
    # it serves while the round waits for the stopped runners: every record was consumed as
    # it was tried, nothing of the recovery is audited yet
    assert _empty(state / "kept-containers")
    assert audit_records(second.audit_path, "session_recovered") == []
    # the sound session's runner came back: its call does not wait for the round
    body = second.invoke("python", {"code": "x + 1"}, session=sound, limits=SLOW_ENGINE).json()
    assert body["status"] == "ok" and body["value"] == 42, body
    assert body["kernel"]["lost"] is False, body
    assert audit_records(second.audit_path, "session_recovered") == []
    # a stopped runner's session: its call waits for the round's bound, then a fresh kernel
    # that says the old one was lost; its files are there
    body = second.invoke("python", {"code": "open('notes.txt').read()"}, session=frozen,
                         limits=SLOW_ENGINE).json()
    took = time.monotonic() - started
    assert body["status"] == "ok" and body["value"] == "kept", body
    assert body["kernel"]["lost"] is True and body["kernel"]["reason"] == "daemon_restart", body
    assert took < ADOPT_S + 60, f"the stopped runners held the start {took:.0f} s"
    recovered = {r["session"]: r["kernels_lost"]
                 for r in audit_records(second.audit_path, "session_recovered")}
    restart = [{"backend": "container", "reason": "daemon_restart"}]
    assert recovered == {sound: [], frozen: restart, other: restart}, recovered
    # the stopped runners' containers are gone (a stopped process dies by SIGKILL all the same)
    now = {c.id for c in labelled(docker_client, instance)}
    assert kept[sound].id in now and not {kept[frozen].id, kept[other].id} & now
    for sid in (frozen, other):
        assert second.client.delete(f"/v1/sessions/{sid}").status_code == 204
    _delete_and_stop(second, sound, docker_client, instance)
    assert _empty(state / "run") and _empty(state / "kept-containers")


def test_a_start_killed_while_it_adopts_does_not_wait_again_and_a_stop_suspends_at_once(
        docker_client: Any, tmp_path: Path, policies: Path, state: Path,  # noqa: F811
        instance: str, daemons: list[RunningDaemon]) -> None:  # noqa: F811
    env = _env(instance)
    first = _start(tmp_path, state, env, policies, daemons)
    sids = [_session(first) for _ in range(3)]
    # stopped before the stop: none can answer its suspend; they are waited for at once
    _stop_runners(docker_client, instance, sids[1:])
    started = time.monotonic()
    assert first.stop() == 0
    took = time.monotonic() - started
    # one suspend's wait (5 s) and the rest of the stop, not 5 s per stopped runner after
    # another; the two are not kept (removed), the sound one is
    assert took < 2 * 5.0 + 5.0, f"the stop took {took:.1f} s"
    assert set(_by_session(docker_client, instance)) == {sids[0]}
    _stop_runners(docker_client, instance, sids[:1])  # after the stop, as its own code could
    second = _start(tmp_path, state, env, policies, daemons)
    assert _empty(state / "kept-containers")  # consumed as tried, while the round waits
    second.stop(signal.SIGKILL)  # killed while it adopts
    third = _start(tmp_path, state, env, policies, daemons)
    # nothing left to wait for: every session's call is answered at once, its kernel lost
    for sid in sids:
        asked = time.monotonic()
        body = third.invoke("python", {"code": "open('notes.txt').read()"}, session=sid,
                            limits=SLOW_ENGINE).json()
        assert body["status"] == "ok" and body["value"] == "kept", body
        assert body["kernel"]["lost"] is True, body
        assert time.monotonic() - asked < ADOPT_S, "a call waited for a consumed record"
    for sid in sids[1:]:
        assert third.client.delete(f"/v1/sessions/{sid}").status_code == 204
    _delete_and_stop(third, sids[0], docker_client, instance)
    wait_until(lambda: _empty(state / "run"), timeout=30, what="the runner directories gone")
