"""File tools through the real daemon: the path the policy checks is the path that is opened.

A regression: the policy matched the raw string while the backend stripped it, so
``"app.key "``, ``".env\\n"``, ``".env\\u00a0"`` and ``" .git/hooks/pre-commit"`` passed deny
rules; a lone surrogate in a path crashed the call (500).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import RunningDaemon, running_daemon

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = pytest.mark.same_on_every_host(
    "which path the policy checks and which one the daemon opens is the daemon's own path "
    "normalisation (sandboxd.paths), the same code on any kernel")

SECRETS = {"app.key": "KEY-CANARY", ".env": "ENV-CANARY", "keys/id_rsa": "RSA-CANARY"}

READ_ATTACKS = [
    "app.key ", " app.key", "app.key\t", ".env\n", "\n.env", ".env\r", ".env\u00a0",
    ".env\u2007", ".env\u3000", ".env\u200b", "\u200b.env", ".env\ufeff", ".env\u202e",
    "./.env\x0b", ".env\x85", "keys/id_rsa ", "keys /id_rsa", "keys/\u00a0id_rsa",
    "/workspace/.env", "/workspace//app.key", "./keys/./id_rsa",
]
WRITE_ATTACKS = [
    " .git/hooks/pre-commit", ".git /hooks/pre-commit", ".git/hooks/pre-commit ",
    ".git/hooks/pre-commit\n", ".git\u00a0/hooks/pre-commit", ".git/config\u200d",
    "/workspace/.git/hooks/post-checkout", ".git/./hooks//pre-push",
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """One default-policy daemon for the module (every test works in its own session): a daemon
    start costs half a minute under the modern-host VM's software emulation."""
    with running_daemon(tmp_path_factory.mktemp("paths-daemon")) as d:
        yield d


def _session(daemon: RunningDaemon) -> tuple[str, Path]:
    """A new session and its workspace directory on the host."""
    session = daemon.client.post("/v1/sessions", json={}).json()["id"]
    ws = daemon.state_dir / "workspaces" / session
    assert ws.is_dir(), ws
    return session, ws


def test_padded_and_invisible_paths_never_reach_protected_files(daemon: RunningDaemon) -> None:
    session, ws = _session(daemon)
    (ws / "keys").mkdir()
    for rel, text in SECRETS.items():
        (ws / rel).write_text(text)
    for path in READ_ATTACKS:
        r = daemon.invoke("read_file", {"path": path}, session=session)
        assert r.status_code == 200, (path, r.text)
        body = r.json()
        assert body["status"] == "denied", (path, body)
        assert not any(s in body["stdout"] for s in SECRETS.values()), (path, body)
        assert body["message"], path
        # the message shows the path with its invisible characters escaped, never raw
        assert "\n" not in body["message"] and "\u202e" not in body["message"], body["message"]
    # the plain names are protected as before, and ordinary files are still readable
    for path in SECRETS:
        assert daemon.invoke("read_file", {"path": path}, session=session).json()["status"] \
            == "denied"
    (ws / "notes with spaces.txt").write_text("fine")
    r = daemon.invoke("read_file", {"path": "./notes with spaces.txt"}, session=session).json()
    assert (r["status"], r["stdout"], r["value"]["path"]) == ("ok", "fine",
                                                               "notes with spaces.txt")


def test_writes_cannot_reach_git_hooks_or_config(daemon: RunningDaemon) -> None:
    session, ws = _session(daemon)
    for path in WRITE_ATTACKS:
        r = daemon.invoke("write_file", {"path": path, "content": "#!/bin/sh\nid\n"},
                          session=session)
        assert r.status_code == 200, (path, r.text)
        assert r.json()["status"] == "denied", (path, r.json())
    made = sorted(str(p.relative_to(ws)) for p in ws.rglob("*"))
    assert made == [], made  # nothing was created, not even a padded twin of .git


def test_non_nfc_paths_are_refused(daemon: RunningDaemon) -> None:
    session, _ws = _session(daemon)
    decomposed = unicodedata.normalize("NFD", "café.txt")
    r = daemon.invoke("write_file", {"path": decomposed, "content": "x"}, session=session).json()
    assert r["status"] == "denied" and "NFC" in r["message"], r
    assert "café.txt" in r["message"]  # it says how to write it
    r = daemon.invoke("write_file", {"path": "café.txt", "content": "x"}, session=session).json()
    assert r["status"] == "ok", r


@pytest.mark.parametrize("tool", ["write_file", "read_file", "list_files"])
def test_lone_surrogate_in_a_path_is_422(daemon: RunningDaemon, tool: str) -> None:
    session, _ws = _session(daemon)
    arguments = '{"path": "a\\ud800b"' + (', "content": "x"}' if tool == "write_file" else "}")
    body = f'{{"arguments": {arguments}, "session": "{session}"}}'
    r = daemon.client.post(f"/v1/tools/{tool}/invoke", content=body,
                           headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["field"] == "path" and "surrogate" in problem["detail"], problem
    # file content and other tools' strings too: never a 500
    body = json.dumps({"arguments": {"path": "ok.txt", "content": "\ud800"}}).replace(
        "\\ud800", "\\udfff")
    r = daemon.client.post("/v1/tools/write_file/invoke", content=body,
                           headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["field"] == "content", r.text
    assert daemon.client.get("/healthz").status_code == 200
