"""Restarts keep sessions (an upgrade must not end users' work), restricted backend, tmpfs
workspaces (root): a clean stop leaves each session's workspace mounted; the next daemon re-adopts
the sessions whose workspace checks out (their files are there; their kernel died with the old
daemon: the next python call says ``kernel.lost`` with reason ``daemon_restart``), and ends,
audited, those whose workspace was tampered with while no daemon ran. ``sessions_survive_restart:
false`` keeps the old behaviour: a stop ends every tmpfs session. A crash (``kill -9``) hides no
lost kernel: the next call says ``daemon_crash``."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.security.test_workspace_limits import kernel_quota  # noqa: F401
from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, daemon_list, start_on_state, uid_range_env
from tests.support.mounts import detach_below, mounts_below
from tests.support.wait import wait_until

pytestmark = pytest.mark.same_on_every_host(
    "re-adopting kept restricted sessions and ending tampered ones is the daemon's own logic; "
    "the service job's restart-keeps-restricted-session-files check restarts the shipped unit "
    "with a tmpfs session kept")

ENV = {"SANDBOXD_CONTAINER_ENABLED": "false", "SANDBOXD_SESSIONS_SURVIVE_RESTART": "true"}


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[RunningDaemon]]:
    """Daemons a test starts on one state directory (stopped at the end, whatever happened);
    every test leaves no mount below it."""
    with daemon_list() as started:
        yield started
    left = detach_below(tmp_path / "state" / "workspaces")  # never leave a mount on the host
    assert left == [], "a workspace mount outlived the test"


def _session_with_state(d: RunningDaemon) -> str:
    sid = d.client.post("/v1/sessions").json()["id"]
    r = d.invoke("write_file", {"path": "notes.txt", "content": "kept"}, session=sid)
    assert r.json()["status"] == "ok", r.text
    r = d.invoke("python", {"code": "x = 41\nx"}, session=sid)
    assert r.json()["value"] == 41 and r.json()["kernel"]["fresh"] is True, r.text
    return sid


def _run_until_killed(url: str, sid: str) -> None:
    """A session's first python call that runs (after writing ``started``) until the daemon
    dies under it: its connection error is expected."""
    code = "open('started', 'w').close()\nwhile True:\n    pass\n"
    with contextlib.suppress(httpx.HTTPError), httpx.Client(base_url=url, timeout=180) as c:
        c.post("/v1/tools/python/invoke", json={
            "arguments": {"code": code}, "session": sid, "limits": {"timeout_s": 120}})


def _mount_tmpfs(path: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"planted", str(path).encode(), b"tmpfs", 0, b"size=64k") != 0:
        raise OSError(ctypes.get_errno(), "mount")


def test_restart_keeps_sound_sessions_and_ends_tampered_ones(
        tmp_path: Path, kernel_quota: None, daemons: list[RunningDaemon]) -> None:  # noqa: F811
    """One stop and one start (a daemon start costs 20-60 s under the VM job's emulation): the
    sound session keeps its files and says its kernel was lost; the two whose workspace was
    tampered with while no daemon ran end, audited."""
    env = {**ENV, **uid_range_env()}  # the same uid range for both daemons
    first = start_on_state(tmp_path, daemons, env)
    chowned, covered, sid = (_session_with_state(first) for _ in range(3))
    ws_root = tmp_path / "state" / "workspaces"
    assert first.stop() == 0
    # the stop left the sessions: their workspaces are still mounted (the mounts are the host's)
    assert sorted(mounts_below(ws_root)) == sorted(
        str(ws_root / s) for s in (chowned, covered, sid))
    os.chown(ws_root / chowned, 0, 0)  # its owner changed
    _mount_tmpfs(ws_root / covered)  # something else mounted in its place
    (ws_root / covered / "planted").symlink_to("/etc")
    second = start_on_state(tmp_path, daemons, env)
    for gone in (chowned, covered):
        assert second.client.get(f"/v1/sessions/{gone}").status_code == 404
        assert not (ws_root / gone).exists()
    expired = {r["session"]: r["reason"]
               for r in audit_records(second.audit_path, "session_expired")}
    assert "owned by 0:0" in expired[chowned], expired
    assert "something else is mounted" in expired[covered], expired
    assert sid not in expired, expired
    recovered = audit_records(second.audit_path, "session_recovered")
    assert [(r["session"], r["kernels_lost"]) for r in recovered] == [
        (sid, [{"backend": "restricted", "reason": "daemon_restart"}])]
    assert mounts_below(ws_root) == [str(ws_root / sid)]
    # the sound one: its files, and its next python call says the kernel was lost
    assert second.client.get(f"/v1/sessions/{sid}").status_code == 200
    r = second.invoke("read_file", {"path": "notes.txt"}, session=sid)
    assert r.json()["stdout"] == "kept", r.text
    code = "try:\n    x\nexcept NameError:\n    x = 'gone'\nx"
    body = second.invoke("python", {"code": code}, session=sid).json()
    assert body["status"] == "ok" and body["value"] == "gone", body
    assert body["kernel"]["lost"] is True and body["kernel"]["reason"] == "daemon_restart", body
    assert "daemon restarted" in body["message"], body
    # said once: the next call runs in the new kernel
    body = second.invoke("python", {"code": "y = 1\ny"}, session=sid).json()
    assert body["kernel"]["lost"] is False and body["kernel"]["calls"] == 2, body
    assert second.client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_without_the_setting_a_stop_ends_tmpfs_sessions(
        tmp_path: Path, kernel_quota: None, daemons: list[RunningDaemon]) -> None:  # noqa: F811
    env = {**ENV, "SANDBOXD_SESSIONS_SURVIVE_RESTART": "false", **uid_range_env()}
    first = start_on_state(tmp_path, daemons, env)
    sid = _session_with_state(first)
    assert first.stop() == 0
    ws_root = tmp_path / "state" / "workspaces"
    assert mounts_below(ws_root) == [] and list(ws_root.iterdir()) == []
    ended = [r for r in audit_records(first.audit_path, "session_expired")
             if r.get("session") == sid]
    assert len(ended) == 1 and "stopped" in ended[0]["reason"], ended
    second = start_on_state(tmp_path, daemons, env)
    assert second.client.get(f"/v1/sessions/{sid}").status_code == 404
    assert audit_records(second.audit_path, "session_recovered") == []


def test_a_crash_reports_each_kernel_it_ended(
        tmp_path: Path, daemons: list[RunningDaemon]) -> None:
    """``kill -9`` of the daemon, then a start on the same state directory: the session whose
    kernel was live, and the one whose first call (which started its kernel) was running, say
    at their next python call and in ``session_recovered`` that the crash (``daemon_crash``)
    lost it; a session that never ran python and one whose kernel was restarted (ended
    cleanly) before the crash report no loss."""
    env = {**ENV, **uid_range_env()}  # the same uid range for both daemons
    first = start_on_state(tmp_path, daemons, env)
    live = _session_with_state(first)
    never = first.client.post("/v1/sessions").json()["id"]
    r = first.invoke("write_file", {"path": "notes.txt", "content": "kept"}, session=never)
    assert r.json()["status"] == "ok", r.text
    ended = _session_with_state(first)
    r = first.client.post(f"/v1/sessions/{ended}/restart")
    assert r.status_code == 200 and r.json()["restarted"] == ["restricted"], r.text
    busy = first.client.post("/v1/sessions").json()["id"]
    in_flight = threading.Thread(target=_run_until_killed, args=(first.url, busy), daemon=True)
    in_flight.start()
    wait_until(lambda: (tmp_path / "state" / "workspaces" / busy / "started").exists(),
               timeout=120, what="the busy session's first call running")
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    in_flight.join(30)
    second = start_on_state(tmp_path, daemons, env)

    recovered = {r["session"]: r for r in audit_records(second.audit_path, "session_recovered")}
    crashed = [{"backend": "restricted", "reason": "daemon_crash"}]
    assert {s: r["kernels_lost"] for s, r in recovered.items()} == {
        live: crashed, busy: crashed, never: [], ended: []}
    code = "try:\n    x\nexcept NameError:\n    x = 'gone'\nx"
    body = second.invoke("python", {"code": code}, session=live).json()
    assert body["status"] == "ok" and body["value"] == "gone", body
    assert body["kernel"]["lost"] is True and body["kernel"]["reason"] == "daemon_crash", body
    assert "daemon crashed" in body["message"], body
    (audited,) = [r for r in audit_records(second.audit_path, "result")
                  if r["request_id"] == body["id"]]
    assert audited["kernel"]["lost"] is True, audited
    assert audited["kernel"]["reason"] == "daemon_crash", audited
    # said once: the next call runs in the new kernel
    body = second.invoke("python", {"code": "x"}, session=live).json()
    assert body["value"] == "gone" and body["kernel"]["lost"] is False, body
    body = second.invoke("python", {"code": "1"}, session=busy).json()
    assert body["kernel"]["lost"] is True and body["kernel"]["reason"] == "daemon_crash", body
    for quiet in (never, ended):
        body = second.invoke("python", {"code": "1"}, session=quiet).json()
        assert body["status"] == "ok" and body["kernel"]["lost"] is False, body
        assert body["kernel"]["fresh"] is True, body
    for sid in (live, never, ended, busy):
        assert second.client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_without_the_setting_a_stop_reports_the_kernels_of_directory_sessions(
        tmp_path: Path, daemons: list[RunningDaemon]) -> None:
    """``sessions_survive_restart: false`` keeps plain-directory sessions (advisory quotas)
    across a stop, not their kernels: a clean stop notes the live ones, so the next call says
    ``daemon_restart`` (never ``daemon_crash``, never nothing)."""
    env = {**ENV, "SANDBOXD_SESSIONS_SURVIVE_RESTART": "false",
           "SANDBOXD_WORKSPACE_QUOTA": "advisory", **uid_range_env()}
    first = start_on_state(tmp_path, daemons, env)
    sid = _session_with_state(first)
    assert first.stop() == 0
    second = start_on_state(tmp_path, daemons, env)
    recovered = audit_records(second.audit_path, "session_recovered")
    assert [(r["session"], r["kernels_lost"]) for r in recovered] == [
        (sid, [{"backend": "restricted", "reason": "daemon_restart"}])], recovered
    body = second.invoke("python", {"code": "open('notes.txt').read()"}, session=sid).json()
    assert body["status"] == "ok" and body["value"] == "kept", body
    assert body["kernel"]["lost"] is True and body["kernel"]["reason"] == "daemon_restart", body
    assert second.client.delete(f"/v1/sessions/{sid}").status_code == 204
