"""Restarts keep sessions (an upgrade must not end users' work), container backend: a clean stop
leaves a session's container running with its kernel (its runner waits for the next daemon); the
next daemon re-adopts it, so the session's next call sees its variables and its files. A container
removed while no daemon ran ends its session (audited). A crash keeps no kernel: the session's next
call says ``daemon_crash``. Nothing is left behind: no container, no runner directory, no
mount."""

from __future__ import annotations

import secrets
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends.container.engine import LABEL_SESSION
from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, daemon_list, start_daemon, uid_range_env
from tests.support.mounts import detach_below
from tests.support.wait import wait_until

from .conftest import labelled
from .test_http import SLOW_ENGINE, daemon_env, policies  # noqa: F401  (a fixture)

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = [pytest.mark.docker, pytest.mark.same_on_every_host(
    "re-adopting, thawing and ending kept sessions is the daemon's and runner's own logic on "
    "the same engine; the VM's service job proves a restart keeps a container session's "
    "kernel and a restricted session's files under the shipped unit "
    "(restart-keeps-container-session, restart-keeps-restricted-session-files)")]


@pytest.fixture
def state() -> Iterator[Path]:
    """A short state path: the runner directories are then below it (``<state>/run``), where
    the next daemon finds them (a socket path must fit in 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="sbx-"))
    yield path / "state"
    left = detach_below(path)  # never leave a mount on the host
    shutil.rmtree(path, ignore_errors=True)
    assert left == [], "a mount outlived the test"


@pytest.fixture
def instance(docker_client: Any) -> Iterator[str]:
    """A fresh instance name; its containers are checked gone (and removed) at the end."""
    name = f"rst{secrets.token_hex(4)}"
    yield name
    left = labelled(docker_client, name)
    for c in left:
        c.remove(force=True)
    assert left == [], f"containers outlived the test: {[c.name for c in left]}"


def _start(tmp_path: Path, state: Path, env: dict[str, str], policies: Path,  # noqa: F811
           started: list[RunningDaemon]) -> RunningDaemon:
    where = tmp_path / f"d{len(started)}"
    where.mkdir()
    d = start_daemon(where, policies_dir=policies, state_dir=state, env=env)
    started.append(d)
    return d


@pytest.fixture
def daemons() -> Iterator[list[RunningDaemon]]:
    with daemon_list() as started:
        yield started


def _delete_and_stop(d: RunningDaemon, sid: str | None, docker_client: Any,
                     instance: str) -> None:
    """End a test: delete its session (if any), stop the daemon, every container gone."""
    if sid is not None:
        assert d.client.delete(f"/v1/sessions/{sid}").status_code == 204
    assert d.stop() == 0
    wait_until(lambda: not labelled(docker_client, instance), timeout=60,
               what="every container of the instance removed")


def _empty(directory: Path) -> bool:
    return not directory.exists() or not list(directory.iterdir())


def _session(d: RunningDaemon) -> str:
    """A container session with a variable and a file. Its first call starts the session's
    container, within the call's time (30 s was short under emulation on a slow host)."""
    sid = d.client.post("/v1/sessions").json()["id"]
    body = d.invoke("python", {"code": "x = 41\nopen('notes.txt', 'w').write('kept')\nx"},
                    session=sid, limits=SLOW_ENGINE).json()
    assert body["limits"]["timeout_s"] == SLOW_ENGINE["timeout_s"], body["limits"]
    assert body["value"] == 41 and body["backend"] == "container", body
    return sid


def _session_containers(docker_client: Any, instance: str) -> list[Any]:
    return [c for c in labelled(docker_client, instance)
            if c.labels.get("sandboxd.role") == "session"]


def _by_session(docker_client: Any, instance: str) -> dict[str, Any]:
    return {c.labels[LABEL_SESSION]: c for c in _session_containers(docker_client, instance)}


def test_restart_keeps_readopts_or_ends_each_kept_session(
        docker_client: Any, tmp_path: Path, policies: Path, state: Path,  # noqa: F811
        instance: str, daemons: list[RunningDaemon]) -> None:
    """Three kept sessions through one stop and one start (a daemon start costs 20-60 s under
    the VM job's emulation): the one whose container still runs is re-adopted with its
    variables and files; the one whose container stopped keeps its files, not its kernel; the
    one whose container was removed ends, audited."""
    env = {**daemon_env(instance), "SANDBOXD_SESSIONS_SURVIVE_RESTART": "true",
           **uid_range_env()}
    first = _start(tmp_path, state, env, policies, daemons)
    sid, stopped, removed = _session(first), _session(first), _session(first)
    assert first.stop() == 0
    kept = _by_session(docker_client, instance)
    # the pool's went, these stay
    assert {s: c.status for s, c in kept.items()} == {
        sid: "running", stopped: "running", removed: "running"}, kept
    kept[stopped].kill()  # as if its runner gave up waiting, or the engine restarted
    kept[removed].remove(force=True)
    second = _start(tmp_path, state, env, policies, daemons)

    # the running one: re-adopted, its kernel's variables and its files
    body = second.invoke("python", {"code": "x + 1"}, session=sid, limits=SLOW_ENGINE).json()
    assert body["status"] == "ok" and body["value"] == 42, body
    assert body["kernel"]["lost"] is False and body["kernel"]["calls"] == 2, body
    body = second.invoke("python", {"code": "open('notes.txt').read()"}, session=sid,
                         limits=SLOW_ENGINE).json()
    assert body["value"] == "kept", body
    # the stopped one: its files, a new kernel that says why the old one went
    body = second.invoke("python", {"code": "open('notes.txt').read()"},
                         session=stopped, limits=SLOW_ENGINE).json()
    assert body["status"] == "ok" and body["value"] == "kept", body
    assert body["kernel"]["lost"] is True and body["kernel"]["reason"] == "daemon_restart", body
    now = _by_session(docker_client, instance)
    assert now[sid].id == kept[sid].id  # the very container, re-adopted
    assert now[stopped].id != kept[stopped].id
    assert set(now) == {sid, stopped}
    recovered = audit_records(second.audit_path, "session_recovered")
    assert sorted((r["session"], r["kernels"], r["kernels_lost"]) for r in recovered) == sorted([
        (sid, ["container"], []),
        (stopped, [], [{"backend": "container", "reason": "daemon_restart"}])]), recovered
    # the removed one: ended, audited, its workspace gone
    assert second.client.get(f"/v1/sessions/{removed}").status_code == 404
    expired = [r for r in audit_records(second.audit_path, "session_expired")
               if r.get("session") == removed]
    assert len(expired) == 1 and "its container is gone" in expired[0]["reason"], expired
    assert not (state / "workspaces" / removed).exists()
    assert second.client.delete(f"/v1/sessions/{stopped}").status_code == 204
    _delete_and_stop(second, sid, docker_client, instance)
    assert _empty(state / "run") and _empty(state / "kept-containers")


def test_a_paused_session_is_thawed_and_kept_at_a_stop(
        docker_client: Any, tmp_path: Path, policies: Path, state: Path,  # noqa: F811
        instance: str, daemons: list[RunningDaemon]) -> None:
    """An idle session's container is paused (it holds no CPU); a frozen runner cannot
    answer the stop's ``suspend``, so the stop thaws it first and keeps it."""
    env = {**daemon_env(instance), "SANDBOXD_SESSIONS_SURVIVE_RESTART": "true",
           "SANDBOXD_SESSION_PAUSE_AFTER_S": "1", **uid_range_env()}
    first = _start(tmp_path, state, env, policies, daemons)
    sid = _session(first)
    (box,) = _session_containers(docker_client, instance)

    def paused() -> bool:
        box.reload()
        return bool(box.attrs["State"]["Paused"])
    wait_until(paused, timeout=60, what="the idle session's container paused")
    assert first.stop() == 0
    kept = _session_containers(docker_client, instance)
    assert [(c.id, c.status) for c in kept] == [(box.id, "running")], kept
    second = _start(tmp_path, state, env, policies, daemons)
    body = second.invoke("python", {"code": "x + 1"}, session=sid, limits=SLOW_ENGINE).json()
    assert body["status"] == "ok" and body["value"] == 42, body
    assert body["kernel"]["lost"] is False, body
    _delete_and_stop(second, sid, docker_client, instance)


def test_an_image_rebuilt_while_stopped_keeps_the_session_not_its_kernel(
        docker_client: Any, tmp_path: Path, policies: Path, state: Path,  # noqa: F811
        instance: str, daemons: list[RunningDaemon]) -> None:
    """An upgrade rebuilds the image between the stop and the start: the kept container's
    runner may speak another protocol, so it is not re-adopted; the session keeps its files
    and its next call says its kernel was lost."""
    env = {**daemon_env(instance), "SANDBOXD_SESSIONS_SURVIVE_RESTART": "true",
           **uid_range_env()}
    real = docker_client.images.get(env.get("SANDBOXD_PYTHON_IMAGE", "sandboxd/python:latest"))
    tag = f"sandboxd/python:{instance}"  # this test's own name for the image
    real.tag(tag)
    other = docker_client.images.get("sandboxd/base-offline:latest")
    try:
        env.update(SANDBOXD_PYTHON_IMAGE=tag, SANDBOXD_SHELL_IMAGE=tag)
        first = _start(tmp_path, state, env, policies, daemons)
        sid = _session(first)
        assert first.stop() == 0
        (kept,) = _session_containers(docker_client, instance)
        other.tag(tag)  # "rebuilt": the tag names another image now
        second = _start(tmp_path, state, env, policies, daemons)
        real.tag(tag)  # the new image, as far as the new session container is concerned
        wait_until(lambda: kept.id not in [c.id for c in labelled(docker_client, instance)],
                   timeout=60, what="the kept container of the old image removed")
        body = second.invoke("python", {"code": "open('notes.txt').read()"},
                             session=sid, limits=SLOW_ENGINE).json()
        assert body["status"] == "ok" and body["value"] == "kept", body
        assert body["kernel"]["lost"] is True, body
        _delete_and_stop(second, sid, docker_client, instance)
    finally:
        docker_client.images.remove(tag, noprune=True)


def test_a_crash_reports_the_container_kernel_it_ended(
        docker_client: Any, tmp_path: Path, policies: Path, state: Path,  # noqa: F811
        instance: str, daemons: list[RunningDaemon]) -> None:
    """``kill -9`` of the daemon keeps no container kernel: nothing was suspended, so the
    runner sees its daemon hang up and the next start removes the container. The session keeps
    its files, and its next python call (and ``session_recovered``) says the crash lost its
    kernel (``daemon_crash``)."""
    env = {**daemon_env(instance), "SANDBOXD_SESSIONS_SURVIVE_RESTART": "true",
           **uid_range_env()}
    first = _start(tmp_path, state, env, policies, daemons)
    sid = _session(first)
    (crashed,) = _session_containers(docker_client, instance)
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    second = _start(tmp_path, state, env, policies, daemons)
    recovered = audit_records(second.audit_path, "session_recovered")
    assert [(r["session"], r["kernels"], r["kernels_lost"]) for r in recovered] == [
        (sid, [], [{"backend": "container", "reason": "daemon_crash"}])], recovered
    code = "try:\n    x\nexcept NameError:\n    x = 'gone'\n(x, open('notes.txt').read())"
    body = second.invoke("python", {"code": code}, session=sid, limits=SLOW_ENGINE).json()
    assert body["status"] == "ok" and body["value"] == ["gone", "kept"], body
    assert body["kernel"]["lost"] is True and body["kernel"]["reason"] == "daemon_crash", body
    (audited,) = [r for r in audit_records(second.audit_path, "result")
                  if r["request_id"] == body["id"]]
    assert audited["kernel"]["reason"] == "daemon_crash", audited
    assert crashed.id not in [c.id for c in labelled(docker_client, instance)]
    body = second.invoke("python", {"code": "x"}, session=sid, limits=SLOW_ENGINE).json()
    assert body["value"] == "gone" and body["kernel"]["lost"] is False, body
    _delete_and_stop(second, sid, docker_client, instance)
    assert _empty(state / "run") and _empty(state / "kept-containers")
