"""Crash safety: `kill -9` the daemon during 8 in-flight calls, restart it on the same state
directory, and prove that the restart's sweep leaves nothing of the dead daemon behind and
that the audit log still verifies and says what was interrupted."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from pathlib import Path

import httpx
import psutil
import pytest

from tests.service.procs import (
    ProcId,
    audit_verify,
    call_workers,
    cgroup_dirs,
    still_alive,
)
from tests.support.audit import audit_records
from tests.support.daemon import start_daemon
from tests.support.wait import wait_until

pytestmark = pytest.mark.same_on_every_host(
    "the restart's sweep after kill -9 is the daemon's own logic; the service job's restart-"
    "after-sigkill and restart-interrupted-audited checks kill the shipped unit's daemon during"
    " a call and check its cgroups after the restart")

IN_FLIGHT = 8
BUSY = "while True:\n    pass\n"
ENV = {"SANDBOXD_MAX_CONCURRENCY": str(IN_FLIGHT), "SANDBOXD_CONTAINER_ENABLED": "false"}


def _fire(url: str, errors: list[BaseException]) -> None:
    try:
        with httpx.Client(base_url=url, timeout=180) as client:
            client.post(
                "/v1/tools/python/invoke",
                json={"arguments": {"code": BUSY}, "limits": {"timeout_s": 120}},
            )
    except BaseException as exc:  # the daemon dies under us: a connection error is expected
        errors.append(exc)


def test_kill_9_during_in_flight_calls_then_restart_sweeps_everything(tmp_path: Path) -> None:
    state = tmp_path / "state"
    for sub in ("first", "second"):
        (tmp_path / sub).mkdir()
    first = start_daemon(tmp_path / "first", state_dir=state, env=ENV)
    workers: list[ProcId] = []
    worker_cgroups: set[Path] = set()
    workspaces_before: set[Path] = set()
    second = None
    try:
        own_cgroups = cgroup_dirs(first.proc.pid)
        # A session with a file in it, idle during the crash: it must be recovered.
        r = first.client.post("/v1/sessions", json={})
        assert r.status_code == 201, r.text
        session = r.json()["id"]
        r = first.invoke("write_file", {"path": "notes.txt", "content": "kept"}, session=session)
        assert r.status_code == 200 and r.json()["status"] == "ok", r.text
        errors: list[BaseException] = []
        threads = [
            threading.Thread(target=_fire, args=(first.url, errors), daemon=True)
            for _ in range(IN_FLIGHT)
        ]
        for t in threads:
            t.start()

        # Pre-forked idle workers exist before the calls (and may burn CPU while they start,
        # on a slow host): the calls are the busy workers that run in a workspace.
        workers = wait_until(lambda: call_workers(first.proc.pid, state, IN_FLIGHT),
                             timeout=120, what=f"{IN_FLIGHT} busy workers")
        for p in workers:
            worker_cgroups |= cgroup_dirs(p.pid) - own_cgroups
            with contextlib.suppress(psutil.Error):
                workspaces_before.add(Path(psutil.Process(p.pid).cwd()))
        ws_root = state / "workspaces"
        if ws_root.exists():
            workspaces_before |= {w for w in ws_root.iterdir() if w.name != session}
        decisions = [
            r["request_id"]
            for r in audit_records(first.audit_path)
            if r.get("event") == "decision" and r.get("tool") == "python"
        ]
        assert len(decisions) == IN_FLIGHT, decisions

        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(30)
        for t in threads:
            t.join(30)
        assert len(errors) == IN_FLIGHT, "every in-flight call lost its connection"
        survivors_of_kill = still_alive(workers)
        print(
            f"{len(workers)} worker processes, {len(survivors_of_kill)} alive right after "
            f"kill -9; {len(worker_cgroups)} worker cgroups; "
            f"{len(workspaces_before)} workspaces"
        )

        # --- restart on the same state directory: start-up sweeps before serving
        second = start_daemon(tmp_path / "second", state_dir=state, env=ENV)

        with contextlib.suppress(AssertionError):  # SIGKILL delivery is asynchronous
            wait_until(lambda: not still_alive(workers), timeout=5, interval=0.1,
                       what="orphans to be gone")
        survivors = still_alive(workers)
        assert not survivors, f"processes of the dead daemon survived the sweep: {survivors}"
        assert worker_cgroups, "the workers ran in no cgroup of their own (no memory/pids limit)"
        left_cgroups = sorted(str(d) for d in worker_cgroups if d.exists())
        assert not left_cgroups, f"cgroups of the dead daemon survived: {left_cgroups}"
        left_ws = sorted(str(w) for w in workspaces_before if w.exists())
        assert not left_ws, f"temp workspaces of the dead daemon survived: {left_ws}"

        # --- the audit log verifies and says what was interrupted
        verify = audit_verify(second.audit_path)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        records = audit_records(second.audit_path)
        events = [r.get("event") for r in records]
        assert "interrupted" in events, f"no 'interrupted' record; last events: {events[-6:]}"
        at = len(events) - 1 - events[::-1].index("interrupted")
        assert set(decisions) <= set(records[at]["requests"]), records[at]
        startups = [i for i, e in enumerate(events) if e == "startup"]
        assert len(startups) == 2, events
        assert startups[0] < at < startups[1], "interrupted belongs to the restart, before serving"

        # --- and the restarted daemon works, with the session recovered
        ok = second.invoke("python", {"code": "6 * 7"})
        assert ok.status_code == 200 and ok.json()["value"] == 42, ok.text
        assert second.client.get(f"/v1/sessions/{session}").status_code == 200
        kept = second.invoke("read_file", {"path": "notes.txt"}, session=session)
        assert kept.status_code == 200 and "kept" in kept.text, kept.text
        assert (ws_root / session).is_dir()
    finally:
        for d in (first, second):
            if d is not None:
                d.client.close()
                d.stop()
        # Never leak what we started, even when the daemon's sweep failed.
        for p in still_alive(workers):
            with contextlib.suppress(psutil.Error):
                psutil.Process(p.pid).kill()
        for d in sorted(worker_cgroups, key=lambda x: len(str(x)), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
        for w in workspaces_before:  # only ever under this test's state directory
            if w.is_relative_to(state / "workspaces"):
                shutil.rmtree(w, ignore_errors=True)
