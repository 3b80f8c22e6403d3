"""Ready sessions on the container backend, through a real daemon and the real Docker engine:
sessions made ahead with their container started (``session_pool_size``). A new session takes
one and its first call runs in the container that was waiting (made before the session was
asked for); it is a whole session of its own (its own uid and workspace, files before the first
call, another ready one made in its place); a client whose python tool runs elsewhere never
gets one; they follow the policies (made once one runs python in containers, removed once
none does); a call whose policy wants a network gets a container made for it; a taken one
keeps its container and kernel across a clean restart; a stop, and the start after a crash,
leave no container, workspace or mount of a ready session behind (the engine's outage is
tests/faults/test_docker.py's)."""

from __future__ import annotations

import json
import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd.access.tokens import add_token
from sandboxd.workspaces.quota import mounts_below
from tests.support.daemon import RunningDaemon, daemon_list, start_daemon, uid_range_env
from tests.support.wait import wait_until

from .conftest import labelled
from .test_http import SLOW_ENGINE_POLICY, daemon_env

#: a second client whose python tool runs on the restricted backend
RESTRICTED_CLIENT = """\
version: 1
name: restricted
clients: ["elsewhere"]
tools:
  python:
    backend: restricted
"""
#: the policy of the tests: python and shell in containers, and a file tool
CONTAINERS = SLOW_ENGINE_POLICY + '  write_file: {paths: {allow: ["**"]}, max_bytes: 1Mi}\n'
#: every client's python in containers, with a network (the ready ones have none)
NETWORK_POLICY = SLOW_ENGINE_POLICY.replace("network: none", "network: bridge", 1)
assert NETWORK_POLICY != SLOW_ENGINE_POLICY


#: the tests of the daemon's own logic (the VM job runs those of mounts and containers)
SAME_LOGIC = pytest.mark.same_on_every_host(
    "which client takes a ready session and which policy wants them is the daemon's own "
    "logic; the mounts and containers of ready sessions are the other tests'")


def _start(tmp_path: Path, instance: str, *, policy: str = CONTAINERS,
           size: str = "1", name: str = "d", extra: dict[str, str] | None = None
           ) -> RunningDaemon:
    """A daemon on ``tmp_path/state``; the policies in ``tmp_path/policies``; its client the
    token's ``alice`` (``tmp_path/bob`` holds the token of the client ``elsewhere``)."""
    where = tmp_path / name
    where.mkdir()
    policies = tmp_path / "policies"
    tokens = tmp_path / "tokens.yaml"
    if not policies.is_dir():
        policies.mkdir()
        (policies / "containers.yaml").write_text(policy)
        (policies / "restricted.yaml").write_text(RESTRICTED_CLIENT)
        (tmp_path / "alice").write_text(add_token(tokens, "alice"))
        (tmp_path / "bob").write_text(add_token(tokens, "elsewhere"))
    env = daemon_env(instance) | {"SANDBOXD_WARM_POOL_SIZE": "0",
                                  "SANDBOXD_SESSION_POOL_SIZE": size,
                                  "SANDBOXD_TOKENS_FILE": str(tokens)} | (extra or {})
    return start_daemon(where, policies_dir=policies, env=env, state_dir=tmp_path / "state",
                        token=(tmp_path / "alice").read_text())


@pytest.fixture
def daemons() -> Iterator[list[RunningDaemon]]:
    with daemon_list() as started:
        yield started


def _ready(d: RunningDaemon, want: int) -> None:
    """Wait until the daemon holds ``want`` ready sessions (the bound catches a hang)."""
    wait_until(lambda: d.client.get("/v1/capacity").json()["sessions"]["ready"] == want,
               timeout=180, what=f"{want} ready sessions", detail=d.log)


def _sessions(docker_client: Any, instance: str) -> dict[str, Any]:
    """This daemon's session containers, by the session their label names."""
    return {c.labels["sandboxd.session"]: c for c in labelled(docker_client, instance)
            if c.labels.get("sandboxd.role") == "session"}


def test_a_new_session_takes_a_ready_one_and_its_container(docker_client: Any,
                                                          tmp_path: Path,
                                                          daemons: list[RunningDaemon]) -> None:
    instance = f"rdy{secrets.token_hex(4)}"
    d = _start(tmp_path, instance)
    daemons.append(d)
    _ready(d, 1)
    (waiting,) = _sessions(docker_client, instance).values()  # made before any session
    sid = d.client.post("/v1/sessions").json()["id"]
    assert waiting.labels["sandboxd.session"] == sid
    # its files before its first call are the container's; its uid is its own
    put = d.client.put(f"/v1/sessions/{sid}/files/note.txt", content=b"before")
    assert put.status_code == 200, put.text
    result = d.python(sid, "import os\nprint(open('note.txt').read(), os.getuid())")
    assert result["status"] == "ok", (result.get("message"), result.get("stderr"))
    text, uid = result["stdout"].split()
    assert text == "before"
    view = d.client.get(f"/v1/sessions/{sid}").json()
    assert waiting.attrs["Config"]["User"] == f"{uid}:{uid}"
    assert result["kernel"]["fresh"] is True and not result["kernel"].get("lost")
    # the same container served the call (none was made for it), and it keeps the kernel
    waiting.reload()
    assert waiting.status == "running"
    assert set(_sessions(docker_client, instance)) >= {sid}
    assert d.python(sid, "x = 41")["status"] == "ok"
    assert d.python(sid, "print(x + 1)")["stdout"] == "42\n"
    # another one is made in its place, for another session, with another uid
    _ready(d, 1)
    others = {s: c for s, c in _sessions(docker_client, instance).items() if s != sid}
    (other,) = others.values()
    assert other.attrs["Config"]["User"] != waiting.attrs["Config"]["User"]
    second = d.client.post("/v1/sessions").json()["id"]
    assert second in others
    mine = d.python(second, "import os\nprint(sorted(os.listdir('.')))")
    assert mine["stdout"] == "[]\n", mine  # the first session's file is not there
    audit = [json.loads(line) for line in d.audit_path.read_text().splitlines()]
    created = [r.get("session") for r in audit if r.get("event") == "session_created"]
    assert created == [sid, second]
    assert view["id"] == sid


@SAME_LOGIC
def test_a_client_whose_python_runs_elsewhere_never_takes_one(docker_client: Any,
                                                             tmp_path: Path,
                                                             daemons: list[RunningDaemon],
                                                             ) -> None:
    instance = f"rdy{secrets.token_hex(4)}"
    d = _start(tmp_path, instance)
    daemons.append(d)
    _ready(d, 1)
    (waiting,) = _sessions(docker_client, instance)
    bob = {"Authorization": f"Bearer {(tmp_path / 'bob').read_text()}"}
    r = d.client.post("/v1/sessions", headers=bob)
    assert r.status_code == 201, r.text
    assert r.json()["id"] != waiting
    assert d.client.get("/v1/capacity").json()["sessions"]["ready"] == 1
    assert set(_sessions(docker_client, instance)) == {waiting}


@SAME_LOGIC
def test_a_call_that_wants_a_network_gets_a_container_made_for_it(
        docker_client: Any, tmp_path: Path, daemons: list[RunningDaemon]) -> None:
    instance = f"rdy{secrets.token_hex(4)}"
    d = _start(tmp_path, instance)
    daemons.append(d)
    _ready(d, 1)
    (waiting,) = _sessions(docker_client, instance).values()
    sid = d.client.post("/v1/sessions").json()["id"]
    assert waiting.labels["sandboxd.session"] == sid
    assert waiting.attrs["HostConfig"]["NetworkMode"] == "none"
    _ready(d, 1)
    # the admin gives python a network before the session's first call: no ready session
    # is made for it any more (theirs have none), and that call gets a container with it
    (tmp_path / "policies" / "containers.yaml").write_text(NETWORK_POLICY)
    _ready(d, 0)
    result = d.python(sid, "print('up')")
    assert result["status"] == "ok" and result["stdout"] == "up\n", result
    (serving,) = [c for s, c in _sessions(docker_client, instance).items() if s == sid]
    assert serving.id != waiting.id
    assert serving.attrs["HostConfig"]["NetworkMode"] == "bridge"
    assert waiting.id not in {c.id for c in labelled(docker_client, instance)}


def _leftovers(docker_client: Any, instance: str, state: Path) -> tuple[list[str], list[str],
                                                                      list[Path]]:
    """This instance's containers, the workspaces and the mounts below the state dir."""
    root = state / "workspaces"
    dirs = sorted(os.listdir(root)) if root.is_dir() else []
    return ([c.name for c in labelled(docker_client, instance)], dirs,
            mounts_below(state))


def test_a_stop_leaves_nothing_of_a_ready_session(docker_client: Any, tmp_path: Path,
                                                  daemons: list[RunningDaemon]) -> None:
    instance = f"rdy{secrets.token_hex(4)}"
    d = _start(tmp_path, instance, size="2")
    _ready(d, 2)
    assert len(_sessions(docker_client, instance)) == 2
    assert d.stop() == 0
    d.client.close()
    assert _leftovers(docker_client, instance, tmp_path / "state") == ([], [], [])


def test_the_start_after_a_crash_removes_the_ready_sessions_it_left(
        docker_client: Any, tmp_path: Path, daemons: list[RunningDaemon]) -> None:
    instance = f"rdy{secrets.token_hex(4)}"
    d = _start(tmp_path, instance, size="2")
    _ready(d, 2)
    left = set(_sessions(docker_client, instance))
    d.stop(signal.SIGKILL)
    d.client.close()
    assert set(_sessions(docker_client, instance)) == left  # a crash removes nothing
    again = _start(tmp_path, instance, name="again", size="0")
    daemons.append(again)
    state = tmp_path / "state"
    assert _leftovers(docker_client, instance, state) == ([], [], [])
    for sid in left:  # none of them became anybody's session
        r = again.client.get(f"/v1/sessions/{sid}")
        assert r.status_code == 404, r.text


@SAME_LOGIC
def test_they_are_made_once_a_policy_runs_python_in_containers(
        docker_client: Any, tmp_path: Path, daemons: list[RunningDaemon]) -> None:
    instance = f"rdy{secrets.token_hex(4)}"
    d = _start(tmp_path, instance, policy=RESTRICTED_CLIENT.replace("elsewhere", "alice").replace(
        "name: restricted", "name: alices", 1))
    daemons.append(d)
    assert d.python(d.client.post("/v1/sessions").json()["id"], "print(1)")["backend"] == \
        "restricted"
    assert d.client.get("/v1/capacity").json()["sessions"]["ready"] == 0
    assert _sessions(docker_client, instance) == {}
    # the admin sends alice's python to containers (a reload): ready sessions follow
    (tmp_path / "policies" / "containers.yaml").write_text(SLOW_ENGINE_POLICY.replace(
        'clients: ["*"]', 'clients: ["alice"]', 1))
    _ready(d, 1)
    assert "sandboxd_sessions_ready 1.0" in d.client.get("/metrics").text
    (waiting,) = _sessions(docker_client, instance)
    # and go once no policy wants them: container, workspace and mount
    (tmp_path / "policies" / "containers.yaml").unlink()
    _ready(d, 0)
    wait_until(lambda: waiting not in _sessions(docker_client, instance)
               and not (tmp_path / "state" / "workspaces" / waiting).exists(),
               timeout=120, what="the ready session's removal", detail=d.log)
    assert not [m for m in mounts_below(tmp_path / "state") if m.name == waiting]


@SAME_LOGIC
def test_a_taken_one_keeps_its_container_and_kernel_across_a_restart(
        docker_client: Any, tmp_path: Path, daemons: list[RunningDaemon]) -> None:
    instance = f"rdy{secrets.token_hex(4)}"
    # (the restarted daemon has the same uid range: a session keeps its uid across it)
    keep = {"SANDBOXD_SESSIONS_SURVIVE_RESTART": "true"} | uid_range_env()
    d = _start(tmp_path, instance, extra=keep)
    _ready(d, 1)
    (waiting,) = _sessions(docker_client, instance).values()
    sid = d.client.post("/v1/sessions").json()["id"]
    assert waiting.labels["sandboxd.session"] == sid
    assert d.python(sid, "x = 41")["status"] == "ok"
    assert d.stop() == 0  # a clean stop keeps the session's container, removes the ready one
    d.client.close()
    assert set(_sessions(docker_client, instance)) == {sid}
    # (its own stop ends the session: nothing of the test outlives it)
    again = _start(tmp_path, instance, name="again", size="0",
                   extra=keep | {"SANDBOXD_SESSIONS_SURVIVE_RESTART": "false"})
    daemons.append(again)
    result = again.python(sid, "print(x + 1)")
    assert result["stdout"] == "42\n" and not result["kernel"].get("lost"), result
    assert waiting.id in {c.id for c in labelled(docker_client, instance)}
