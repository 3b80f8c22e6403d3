"""Session lifetime and quota through the real API: its bookkeeping on the daemon's app in
process (tests/support/inprocess.py), kernels on a real daemon and the restricted backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.daemon import running_daemon
from tests.support.inprocess import inprocess_daemon, seccomp_mode
from tests.support.wait import wait_until


def test_session_expires_after_ttl_and_workspace_is_removed(tmp_path: Path) -> None:
    with inprocess_daemon(tmp_path, env={"SANDBOXD_SESSION_TTL_S": "1"}) as d:
        sid = d.client.post("/v1/sessions").json()["id"]
        assert d.invoke("write_file", {"path": "f", "content": "x"}, session=sid).json()[
            "status"] == "ok"
        workspace = d.state_dir / "workspaces" / sid
        assert workspace.is_dir()
        wait_until(lambda: not workspace.exists(), timeout=10,
                   what="the expired session's workspace to be removed")
        assert d.client.get(f"/v1/sessions/{sid}").status_code == 404
        assert d.invoke("read_file", {"path": "f"}, session=sid).status_code == 404


def test_session_quota_is_enforced(tmp_path: Path) -> None:
    # the quota as a daemon enforces it: a tmpfs per workspace when it may mount (a real
    # daemon process: one that may mount installs a seccomp filter on itself)
    env = {"SANDBOXD_SESSION_QUOTA_BYTES": "10000", "SANDBOXD_WORKSPACE_QUOTA": "auto"}
    with running_daemon(tmp_path, env=env) as d:
        sid = d.client.post("/v1/sessions").json()["id"]
        ok = d.invoke("write_file", {"path": "a", "content": "x" * 6000}, session=sid).json()
        assert ok["status"] == "ok"
        over = d.invoke("write_file", {"path": "b", "content": "y" * 6000}, session=sid).json()
        assert over["status"] == "error" and "quota" in over["message"]
        assert not (d.state_dir / "workspaces" / sid / "b").exists()


def test_session_limit_per_client(tmp_path: Path) -> None:
    with inprocess_daemon(tmp_path, env={"SANDBOXD_MAX_SESSIONS_PER_CLIENT": "2"}) as d:
        assert d.client.post("/v1/sessions").status_code == 201
        assert d.client.post("/v1/sessions").status_code == 201
        third = d.client.post("/v1/sessions")
        assert third.status_code == 409
        assert "maximum" in third.json()["detail"]


def test_sessions_list_restart_and_kernel_cap_on_the_restricted_backend(
        tmp_path: Path) -> None:
    """The sessions list, restart and the max_kernels cap through the real API and the
    restricted backend. The cap's reservations hold calls in flight whatever the backend
    keeps; once the backend keeps kernels, a live kernel also holds its place after the call
    (the branches below follow what the listing says)."""
    import threading

    slow = "import time\ntime.sleep(1.5)\nprint('done')"
    with running_daemon(tmp_path, env={"SANDBOXD_MAX_KERNELS": "2",
                                       "SANDBOXD_CONTAINER_ENABLED": "false"}) as d:
        assert d.client.get("/v1/sessions").json() == []
        sids = [d.client.post("/v1/sessions").json()["id"] for _ in range(3)]
        statuses: dict[str, int] = {}

        def call(sid: str) -> None:
            r = d.invoke("python", {"code": slow}, session=sid, limits={"timeout_s": 30})
            statuses[sid] = r.status_code

        threads = [threading.Thread(target=call, args=(s,)) for s in sids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(statuses.values()) == [200, 200, 429], statuses
        (refused,) = [s for s, code in statuses.items() if code == 429]
        listed = d.client.get("/v1/sessions").json()
        assert [s["id"] for s in listed] == sids
        live = [s["id"] for s in listed if s["kernel"]["live"]]
        assert refused not in live and all(s["kernel"]["live"] == bool(s["kernel"]["backends"])
                                           for s in listed)
        again = d.invoke("python", {"code": "print(1)"}, session=refused)
        # two kernels kept alive fill the cap; without kept kernels nothing is live now
        assert again.status_code == (429 if len(live) == 2 else 200), again.text
        if again.status_code == 429:
            assert again.json()["type"].endswith("/too-many-kernels")
        admitted = [s for s in sids if s != refused]
        r = d.client.post(f"/v1/sessions/{admitted[0]}/restart")
        assert r.status_code == 200, r.text
        assert r.json()["restarted"] == (["restricted"] if admitted[0] in live else [])
        assert r.json()["kernel"] == {"live": False, "backends": []}
        # a restart frees a place under the cap
        assert d.invoke("python", {"code": "print(2)"}, session=refused).status_code == 200
        assert d.client.post("/v1/sessions/ses_unknown/restart").status_code == 404
        audit = d.audit_path.read_text()
        assert '"kernel_restart"' in audit and '"rejected"' in audit


def test_an_in_process_daemon_never_filters_the_test_process(tmp_path: Path) -> None:
    """A daemon that may mount installs a seccomp filter on itself (sandboxd.workspaces.quota): the
    in-process daemon refuses that configuration, so the test process keeps its syscalls
    (make test once ran every mount test after tests/api with mount(2) refused)."""
    with pytest.raises(ValueError, match="workspace_quota=advisory only"):
        inprocess_daemon(tmp_path, env={"SANDBOXD_WORKSPACE_QUOTA": "auto"}).__enter__()
    with inprocess_daemon(tmp_path / "plain") as d:
        assert d.client.get("/healthz").status_code == 200
    assert seccomp_mode() == 0
