"""Idle restricted kernels hibernated to disk (``kernel_hibernate_after_s``), through a real
daemon and the restricted backend: an idle kernel's state is pickled inside its sandbox and
written to the state directory, the kernel process ends, and the session's next call wakes it
in a fresh kernel with its state (``kernel.fresh: false``, ``calls`` counted on). A kernel
holding what cannot be pickled stays awake; a state that cannot be restored is said (the code
does not run); a sleeping kernel holds no place under ``max_kernels``; restart and close drop
it; a crash loses it as it loses a kernel in memory, and says so. The modules' own state
(``random``'s generator, ``decimal``'s context) wakes with it."""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, daemon_list, start_on_state, uid_range_env
from tests.support.wait import wait_until

AFTER_S = 0.3
ENV = {"SANDBOXD_CONTAINER_ENABLED": "false", "SANDBOXD_KERNEL_HIBERNATE_AFTER_S": str(AFTER_S),
       "SANDBOXD_MAX_SESSIONS_PER_CLIENT": "12"}

SETUP = """
import math
x = list(range(10))
def f(a):
    return a + len(x)
class Box:
    def __init__(self, v):
        self.v = v
b = Box(7)
f(1)
"""


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[RunningDaemon]]:
    with daemon_list() as started:
        yield started


def _asleep(d: RunningDaemon) -> Path:
    return d.state_dir / "hibernated"


def _state_file(d: RunningDaemon, sid: str) -> Path:
    return _asleep(d) / f"{sid}.state"


def _wait_asleep(d: RunningDaemon, sid: str) -> Path:
    path = _state_file(d, sid)
    wait_until(lambda: sid not in _kernel_sessions(d) and path.exists(), timeout=60,
               what=f"session {sid}'s kernel hibernated")
    return path


def _kernel_sessions(d: RunningDaemon) -> set[str]:
    """Sessions whose kernel process runs now (its working directory is the workspace)."""
    found = set()
    root = psutil.Process(d.proc.pid)
    for p in root.children(recursive=True):
        try:
            if "/workspaces/" in p.cwd() and p.status() != psutil.STATUS_ZOMBIE:
                found.add(Path(p.cwd()).name)
        except psutil.Error:
            continue
    return found


def test_an_idle_kernel_sleeps_on_disk_and_wakes_with_its_state(
        tmp_path: Path, daemons: list[RunningDaemon]) -> None:
    d = start_on_state(tmp_path, daemons, ENV)
    sid = d.client.post("/v1/sessions").json()["id"]
    first = d.python(sid, SETUP)
    assert first["value"] == 11 and first["kernel"]["fresh"] is True, first
    path = _wait_asleep(d, sid)
    mode = path.stat()
    assert stat.S_IMODE(mode.st_mode) == 0o600 and mode.st_uid == os.getuid(), mode
    cap = d.client.get("/v1/capacity").json()["kernels"]
    assert cap["hibernated"] == 1 and cap["live"] == 0, cap
    assert "sandboxd_kernels_hibernated 1.0" in d.client.get("/metrics").text
    view = d.client.get(f"/v1/sessions/{sid}").json()
    assert view["kernel"] == {"live": True, "backends": ["restricted"]}, view
    woke = d.python(sid, "x.append(5)\n(f(2), b.v, math.floor(math.pi))")
    assert woke["status"] == "ok" and woke["value"] == [13, 7, 3], woke
    assert woke["kernel"]["fresh"] is False and woke["kernel"]["calls"] == 2, woke
    assert not path.exists()
    assert d.client.get("/v1/capacity").json()["kernels"]["hibernated"] == 0
    # it sleeps again, and a fork of a sleeping session carries its state
    _wait_asleep(d, sid)
    r = d.client.post(f"/v1/sessions/{sid}/fork", json={"count": 1})
    assert r.status_code == 201 and r.json()["kernel"]["carried"] is True, r.text
    child = r.json()["sessions"][0]["id"]
    assert d.python(child, "len(x)")["value"] == 11
    again = d.python(sid, "len(x)")
    assert again["value"] == 11 and again["kernel"]["calls"] == 3, again


def test_a_woken_kernel_goes_on_with_its_modules_state(
        tmp_path: Path, daemons: list[RunningDaemon]) -> None:
    """``random``'s generator and ``decimal``'s context live in the modules, not in the
    names: a woken kernel draws the numbers it would have drawn awake, and keeps its
    precision."""
    d = start_on_state(tmp_path, daemons, ENV)
    awake, sleeper = (d.client.post("/v1/sessions").json()["id"] for _ in range(2))
    setup = ("import random\nimport decimal\nrandom.seed(1234)\nrandom.random()\n"
             "decimal.getcontext().prec = 5\n0")
    draw = "[random.random() for i in range(3)], str(decimal.Decimal(1) / decimal.Decimal(7))"
    for sid in (awake, sleeper):
        assert d.python(sid, setup)["status"] == "ok"
    expected = d.python(awake, draw)["value"]
    assert expected[1] == "0.14286", expected
    _wait_asleep(d, sleeper)
    body = d.python(sleeper, draw)
    assert body["kernel"]["fresh"] is False and body["value"] == expected, body
    # a fork does not take them: its generator is its own (siblings must not draw alike)
    r = d.client.post(f"/v1/sessions/{awake}/fork", json={"count": 1})
    assert r.status_code == 201, r.text
    child = r.json()["sessions"][0]["id"]
    assert d.python(child, draw)["value"][0] != d.python(awake, draw)["value"][0]


def test_what_cannot_be_pickled_keeps_a_kernel_awake(
        tmp_path: Path, daemons: list[RunningDaemon]) -> None:
    """The sweep looks at the kernels in the order they fell idle: once a kernel idle since
    later sleeps, the earlier one was looked at, and it stayed awake."""
    d = start_on_state(tmp_path, daemons, ENV)
    awake, later = (d.client.post("/v1/sessions").json()["id"] for _ in range(2))
    assert d.python(awake, "g = (i for i in range(3))\nx = 1\nx")["value"] == 1
    assert d.python(later, "x = 2\nx")["value"] == 2
    _wait_asleep(d, later)
    assert awake in _kernel_sessions(d) and not _state_file(d, awake).exists()
    body = d.python(awake, "next(g), x")
    assert body["value"] == [0, 1] and body["kernel"]["calls"] == 2, body


def test_a_state_that_cannot_be_restored_or_read_is_said(
        tmp_path: Path, daemons: list[RunningDaemon]) -> None:
    d = start_on_state(tmp_path, daemons, ENV)
    sid = d.client.post("/v1/sessions").json()["id"]
    assert d.python(sid, SETUP)["status"] == "ok"
    path = _wait_asleep(d, sid)
    path.write_bytes(b"\x00" * path.stat().st_size)  # the same size, not a pickle
    body = d.python(sid, "open('ran', 'w').close()\nx")
    assert body["status"] == "error", body
    assert "could not be restored" in body["message"], body
    assert body["kernel"] == {"fresh": True, "calls": 1, "lost": True,
                              "reason": "not_restored", "interrupted": False}, body
    assert not (d.state_dir / "workspaces" / sid / "ran").exists()
    body = d.python(sid, "y = 1\ny")
    assert body["status"] == "ok" and body["kernel"]["calls"] == 2, body
    assert body["kernel"]["lost"] is False, body
    # a state file gone while it slept: the call runs in a fresh kernel, and says the loss
    path = _wait_asleep(d, sid)
    path.unlink()
    body = d.python(sid, "try:\n    y\nexcept NameError:\n    y = 'gone'\ny")
    assert body["status"] == "ok" and body["value"] == "gone", body
    assert body["kernel"]["lost"] is True and body["kernel"]["reason"] == "not_restored", body
    assert body["kernel"]["fresh"] is True and "cannot be read" in body["message"], body


def test_a_sleeping_kernel_holds_no_place_under_max_kernels(
        tmp_path: Path, daemons: list[RunningDaemon]) -> None:
    d = start_on_state(tmp_path, daemons, {**ENV, "SANDBOXD_MAX_KERNELS": "1"})
    asleep, other = (d.client.post("/v1/sessions").json()["id"] for _ in range(2))
    assert d.python(asleep, "x = 1\nx")["value"] == 1
    _wait_asleep(d, asleep)
    # the one place is free while it sleeps: another session's kernel starts
    assert d.python(other, "2")["value"] == 2
    # restart and close drop a sleeping kernel (and its file)
    _wait_asleep(d, other)
    r = d.client.post(f"/v1/sessions/{asleep}/restart")
    assert r.status_code == 200 and r.json()["restarted"] == ["restricted"], r.text
    assert not _state_file(d, asleep).exists()
    body = d.python(asleep, "try:\n    x\nexcept NameError:\n    x = 'gone'\nx")
    assert body["value"] == "gone" and body["kernel"]["fresh"] is True, body
    assert d.client.delete(f"/v1/sessions/{other}").status_code == 204
    assert not _state_file(d, other).exists()


def test_a_crash_or_a_stop_loses_a_sleeping_kernel_and_says_so(
        tmp_path: Path, daemons: list[RunningDaemon]) -> None:
    """A sleeping kernel is one of the session's live kernels: ``kill -9`` loses it as
    ``daemon_crash``, a clean stop as ``daemon_restart`` (its file goes either way)."""
    # plain-directory workspaces (advisory quotas) outlive a clean stop; the same uid range
    env = {**ENV, "SANDBOXD_WORKSPACE_QUOTA": "advisory", **uid_range_env()}
    first = start_on_state(tmp_path, daemons, env)
    sid = first.client.post("/v1/sessions").json()["id"]
    assert first.python(sid, "x = 41\nx")["value"] == 41
    _wait_asleep(first, sid)
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    second = start_on_state(tmp_path, daemons, env)
    assert not _asleep(second).exists() or list(_asleep(second).iterdir()) == []
    recovered = {r["session"]: r for r in audit_records(second.audit_path, "session_recovered")}
    assert recovered[sid]["kernels_lost"] == [{"backend": "restricted",
                                               "reason": "daemon_crash"}], recovered
    body = second.python(sid, "try:\n    x\nexcept NameError:\n    x = 'gone'\nx")
    assert body["value"] == "gone", body
    assert body["kernel"]["lost"] is True and body["kernel"]["reason"] == "daemon_crash", body
    _wait_asleep(second, sid)
    assert second.stop() == 0
    assert not _asleep(second).exists()
    third = start_on_state(tmp_path, daemons, env)
    body = third.python(sid, "try:\n    x\nexcept NameError:\n    x = 'gone'\nx")
    assert body["value"] == "gone", body
    assert body["kernel"]["lost"] is True and body["kernel"]["reason"] == "daemon_restart", body
