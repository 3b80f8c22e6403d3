"""Forking a session through the real daemon and the restricted backend: forks get a copy of
the parent's files (and its live Python state: tests/api/test_fork_state.py), each in a
sandbox of its own (own uid and files), diverge independently, count against the client's
sessions (all or none) and are audited. Their isolation from each other and from the parent
at the process layer is tests/security/test_fork_isolation.py's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.audit import audit_records
from tests.support.ci import require
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.inprocess import inprocess_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    env = {"SANDBOXD_CONTAINER_ENABLED": "false", "SANDBOXD_MAX_SESSIONS_PER_CLIENT": "8"}
    with running_daemon(tmp_path_factory.mktemp("fork"), env=env) as d:
        yield d


def test_forks_get_the_parents_files_and_diverge(daemon: RunningDaemon) -> None:
    d = daemon
    parent = d.client.post("/v1/sessions").json()["id"]
    wrote = d.invoke("write_file", {"path": "data/deep/notes.txt",
                                    "content": "from the parent"}, session=parent).json()
    assert wrote["status"] == "ok", wrote
    assert d.python(parent, "x = 41")["status"] == "ok"
    # what a sandbox that escaped its language layer could leave (and what it could not)
    workspace = d.state_dir / "workspaces" / parent
    owner = os.stat(workspace).st_uid
    os.symlink("deep/notes.txt", workspace / "data" / "link")
    os.lchown(workspace / "data" / "link", owner, owner)
    os.mkfifo(workspace / "pipe")
    os.chown(workspace / "pipe", owner, owner)
    (workspace / "planted").write_text("not the session's")  # another uid's (root's) file
    r = d.client.post(f"/v1/sessions/{parent}/fork", json={"count": 2})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["parent"] == parent and len(body["sessions"]) == 2
    assert body["kernel"]["carried"] is True and body["kernel"]["parent_backends"] == [
        "restricted"]  # the state itself: tests/api/test_fork_state.py
    skipped = 2 if os.geteuid() == 0 else 1  # the fifo; as root, the file root planted
    assert all(f["entries"] == 4 - (2 - skipped) and f["skipped"] == skipped
               for f in body["files"]), body["files"]
    one, two = (s["id"] for s in body["sessions"])
    assert len({parent, one, two}) == 3
    for child in (one, two):
        seen = d.python(child, "try:\n    x\n    had = True\nexcept NameError:\n"
                                 "    had = False\n[open('data/link').read(), had]")
        assert seen["value"] == ["from the parent", True], seen
        assert os.readlink(d.state_dir / "workspaces" / child / "data" / "link") == \
            "deep/notes.txt"
        assert not (d.state_dir / "workspaces" / child / "pipe").exists()
        assert seen["kernel"]["fresh"], seen["kernel"]
    # each diverges on its own: writes in one are seen nowhere else
    d.python(one, "open('data/deep/notes.txt', 'w').write('one was here')\n"
                    "open('only-one', 'w').write('1')")
    assert d.python(parent, "[open('data/deep/notes.txt').read(), x]")[
        "value"] == ["from the parent", 41]
    assert d.python(two, "open('data/deep/notes.txt').read()")[
        "value"] == "from the parent"
    assert not (d.state_dir / "workspaces" / two / "only-one").exists()
    workspaces = d.state_dir / "workspaces"
    if os.geteuid() == 0:  # each fork's files are its own uid's, never the parent's
        uids = {sid: os.stat(workspaces / sid).st_uid for sid in (parent, one, two)}
        assert len(set(uids.values())) == 3, uids
        for child in (one, two):
            assert os.stat(workspaces / child / "data" / "deep" / "notes.txt").st_uid == uids[
                child]
    records = [x for x in audit_records(d.audit_path) if x["event"] == "session_forked"]
    assert [(x["session"], x["children"], x["kernel_carried"]) for x in records] == [
        (parent, [one, two], True)]
    listed = {s["id"] for s in d.client.get("/v1/sessions").json()}
    assert {parent, one, two} <= listed
    for sid in (parent, one, two):
        assert d.client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_a_fork_counts_against_the_clients_sessions_all_or_none(tmp_path: Path) -> None:
    env = {"SANDBOXD_MAX_SESSIONS_PER_CLIENT": "3"}
    with inprocess_daemon(tmp_path, env=env) as d:
        parent = d.client.post("/v1/sessions").json()["id"]
        assert d.invoke("write_file", {"path": "f.txt", "content": "hello"},
                        session=parent).json()["status"] == "ok"
        over = d.client.post(f"/v1/sessions/{parent}/fork", json={"count": 3})
        assert over.status_code == 409, over.text
        assert over.json()["type"].endswith("/too-many-sessions")
        assert len(d.client.get("/v1/sessions").json()) == 1  # none of them was made
        assert not [x for x in d.records() if x["event"] == "session_forked"]
        ok = d.client.post(f"/v1/sessions/{parent}/fork", json={"count": 2})
        assert ok.status_code == 201, ok.text
        for child in ok.json()["sessions"]:
            read = d.invoke("read_file", {"path": "f.txt"}, session=child["id"]).json()
            assert read["status"] == "ok" and read["value"]["bytes"] == 5, read
            assert "hello" in read["stdout"], read
        assert d.client.post(f"/v1/sessions/{parent}/fork").status_code == 409
        assert d.client.post("/v1/sessions/ses_nope/fork").status_code == 404
        assert d.client.post(f"/v1/sessions/{parent}/fork",
                             json={"count": 0}).status_code == 422


def test_a_fork_over_the_quota_is_undone(tmp_path: Path) -> None:
    require(os.geteuid() == 0, "root (a workspace owned by the session's uid)")
    env = {"SANDBOXD_SESSION_QUOTA_ENTRIES": "16"}
    with inprocess_daemon(tmp_path, env=env) as d:
        parent = d.client.post("/v1/sessions").json()["id"]
        workspace = d.state_dir / "workspaces" / parent
        owner = os.stat(workspace).st_uid
        for i in range(17):  # advisory quota: more entries than a fork may hold
            (workspace / f"f{i}").write_text("x")
            os.chown(workspace / f"f{i}", owner, owner)
        r = d.client.post(f"/v1/sessions/{parent}/fork", json={"count": 2})
        assert r.status_code == 409, r.text
        assert "session_quota_entries" in r.json()["detail"]
        assert [s["id"] for s in d.client.get("/v1/sessions").json()] == [parent]
        assert sorted(p.name for p in (d.state_dir / "workspaces").iterdir()) == [parent]
