"""A session's bash kernel across daemon restarts, as its python kernel: a clean stop keeps its
container and the next daemon re-adopts it with its working directory, variables, functions
and aliases; a bash kernel the restart could not keep (its container stopped meanwhile) or a
crash ended is said lost, with the reason, by the session's next bash call, and by the
recovery's audit record; the session's python kernel is kept or lost on its own. Through real
daemons (stopped with SIGTERM and SIGKILL) and a real Docker engine."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends.container.engine import LABEL_INVOCATION
from tests.container.conftest import labelled
from tests.container.test_http import SLOW_ENGINE, SLOW_ENGINE_POLICY, daemon_env
from tests.container.test_restart_sessions import (  # noqa: F401  (fixtures)
    daemons,
    instance,
    state,
)
from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, start_daemon, uid_range_env
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(600)

POLICY = SLOW_ENGINE_POLICY + "  bash:\n    backend: container\n"
#: state of every kind a bash kernel keeps
PLANT = "cd /tmp; export V=kept; n=41; f() { echo \"fn $1\"; }; alias a='echo al'"
READ = "echo \"$PWD ${V:-gone} ${n:-gone}\"; f x 2>/dev/null || echo nofn; a 2>/dev/null"


def _call(d: RunningDaemon, tool: str, code: str, sid: str) -> dict[str, Any]:
    r = d.invoke(tool, {"code": code}, session=sid, limits=SLOW_ENGINE)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _start(where: Path, state: Path, env: dict[str, str],  # noqa: F811
           started: list[RunningDaemon]) -> RunningDaemon:
    here = where / f"d{len(started)}"
    here.mkdir()
    policies = here / "policies"
    policies.mkdir()
    (policies / "kernels.yaml").write_text(POLICY)
    d = start_daemon(here, policies_dir=policies, state_dir=state, env=env)
    started.append(d)
    return d


def _session(d: RunningDaemon) -> tuple[str, str]:
    """A session with a python kernel and a bash kernel, their state planted; its id and the
    id of its bash container (labelled with the call that started it)."""
    sid = d.client.post("/v1/sessions").json()["id"]
    assert _call(d, "python", "x = 41", sid)["status"] == "ok"
    planted = _call(d, "bash", PLANT, sid)
    assert planted["status"] == "ok" and planted["kernel"]["fresh"] is True, planted
    return sid, planted["id"]


def _recovered(d: RunningDaemon, sid: str) -> tuple[list[str], list[dict[str, str]]]:
    """The live and the lost kernels of the session, as the last start audited them (the
    daemons share one state directory, and so one audit log)."""
    record = [r for r in audit_records(d.audit_path, "session_recovered")
              if r["session"] == sid][-1]
    return record["kernels"], record["kernels_lost"]


def test_a_restart_keeps_a_bash_kernel_or_says_why_it_is_gone(
        docker_client: Any, tmp_path: Path, state: Path, instance: str,  # noqa: F811
        daemons: list[RunningDaemon]) -> None:  # noqa: F811
    env = {**daemon_env(instance), "SANDBOXD_SESSIONS_SURVIVE_RESTART": "true",
           **uid_range_env()}
    first = _start(tmp_path, state, env, daemons)
    kept, _ = _session(first)
    stopped, stopped_bash = _session(first)
    assert first.stop() == 0
    (box,) = docker_client.containers.list(filters={"label": [
        f"{LABEL_INVOCATION}={stopped_bash}", f"sandboxd.daemon={instance}"]})
    box.kill()  # only its bash kernel's container: as if the engine lost it
    second = _start(tmp_path, state, env, daemons)

    # kept: the same bash kernel, every kind of its state; its python kernel too
    res = _call(second, "bash", READ, kept)
    assert res["status"] == "ok" and res["stdout"] == "/tmp kept 41\nfn x\nal\n", res
    assert res["kernel"] == {"fresh": False, "calls": 2, "lost": False, "reason": None,
                             "interrupted": False}, res
    assert _call(second, "python", "x + 1", kept)["value"] == 42
    # its container stopped: the bash kernel is said lost, in bash's words, once; the
    # session's python kernel is kept
    res = _call(second, "bash", READ, stopped)
    assert res["stdout"] == "/workspace gone gone\nnofn\n", res
    assert res["kernel"]["lost"] is True and res["kernel"]["reason"] == "daemon_restart", res
    assert "its Bash state (working directory, variables, functions, aliases) was lost" \
        in res["message"], res
    again = _call(second, "bash", "echo $PWD", stopped)
    assert again["kernel"]["lost"] is False and again["kernel"]["calls"] == 2, again
    res = _call(second, "python", "x", stopped)
    assert res["value"] == 41 and res["kernel"]["lost"] is False, res
    assert _recovered(second, kept) == (["container", "container:bash"], [])
    assert _recovered(second, stopped) == (["container"], [
        {"backend": "container", "language": "bash", "reason": "daemon_restart"}])

    # a crash keeps no kernel: the next bash call says so (daemon_crash), and so does python's
    assert second.stop(signal.SIGKILL) == -signal.SIGKILL
    third = _start(tmp_path, state, env, daemons)
    res = _call(third, "bash", READ, kept)
    assert res["stdout"] == "/workspace gone gone\nnofn\n", res
    assert res["kernel"]["lost"] is True and res["kernel"]["reason"] == "daemon_crash", res
    assert "crashed" in res["message"] and "Bash state" in res["message"], res
    res = _call(third, "python", "'x' in globals()", kept)
    assert res["value"] is False and res["kernel"]["reason"] == "daemon_crash", res
    lost = {(k["backend"], k.get("language"), k["reason"]) for k in _recovered(third, kept)[1]}
    assert lost == {("container", None, "daemon_crash"),
                    ("container", "bash", "daemon_crash")}, lost
    for sid in (kept, stopped):
        assert third.client.delete(f"/v1/sessions/{sid}").status_code == 204
    assert third.stop() == 0
    wait_until(lambda: not labelled(docker_client, instance), timeout=60,
               what="every container of the instance removed")


def test_a_kept_record_whose_lane_names_another_image_is_not_adopted(
        docker_client: Any, tmp_path: Path, state: Path, instance: str,  # noqa: F811
        daemons: list[RunningDaemon]) -> None:  # noqa: F811
    """The kept record says which of the session's containers it is (its lane); one that
    was changed while no daemon ran is not believed: the session ends, audited."""
    env = {**daemon_env(instance), "SANDBOXD_SESSIONS_SURVIVE_RESTART": "true",
           **uid_range_env()}
    first = _start(tmp_path, state, env, daemons)
    sid, _ = _session(first)
    assert first.stop() == 0
    records = sorted((state / "kept-containers").glob("*.json"))
    lanes = [json.loads(p.read_text())["lane"] for p in records]
    assert sorted(lane.split(" ")[1:] for lane in lanes) == [[], ["bash"]], lanes
    for path in records:
        record = json.loads(path.read_text())
        if record["lane"].endswith(" bash"):
            path.write_text(json.dumps({**record, "lane": "other/image bash"}))
    second = _start(tmp_path, state, env, daemons)
    wait_until(lambda: any(r.get("session") == sid
                           for r in audit_records(second.audit_path, "session_expired")),
               timeout=60, what="the session ended at its recovery")
    (expired,) = [r for r in audit_records(second.audit_path, "session_expired")
                  if r.get("session") == sid]
    assert "its record does not match its session" in expired["reason"], expired
    assert second.client.get(f"/v1/sessions/{sid}").status_code == 404
    assert second.stop() == 0
    wait_until(lambda: not labelled(docker_client, instance), timeout=60,
               what="every container of the instance removed")
