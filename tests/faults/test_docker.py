"""Faults answered truthfully: the Docker engine goes away, comes back, or is down at start-up."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest

from tests.faults.dockerd import PrivateDockerd, private_dockerd
from tests.support.audit import audit_records as records
from tests.support.ci import require
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.wait import wait_until

#: pytest-timeout counts a test's fixtures too: the first test of this module also pays the
#: private engine's start, and the sandbox image's load into it where its layers cannot be
#: hard-linked (~220 s of CI's 318 s under the VM job's emulation); still a bound on a hang
#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = [pytest.mark.timeout(900), pytest.mark.same_on_every_host(
    "the engine is the test's own private dockerd (the same Debian docker.io on any host), "
    "and what is proven is the daemon's own healing when it goes and comes back")]

LABEL = "sandboxd.daemon"
SLEEPER = "import time; time.sleep(30)"  # a shell call's python3, busy for its whole test


@pytest.fixture(scope="module")
def engine() -> Iterator[PrivateDockerd]:
    require(shutil.which("dockerd") is not None and os.path.exists("/usr/bin/docker"),
            "dockerd and docker (a Docker engine installation)")
    with private_dockerd() as e:
        yield e


def _env(engine: PrivateDockerd, instance: str) -> dict[str, str]:
    return {"SANDBOXD_DOCKER_URL": engine.url, "SANDBOXD_INSTANCE": instance,
            "SANDBOXD_WARM_POOL_SIZE": "2"}


def _shell_available(d: RunningDaemon) -> bool:
    tools = {t["name"]: t for t in d.client.get("/v1/tools").json()}
    return bool(tools["shell"]["available"])


def _container_ready(d: RunningDaemon) -> dict:
    return d.client.get("/readyz", timeout=30).json()["backends"]["container"]


def _shell(d: RunningDaemon, command: str) -> httpx.Response:
    return d.invoke("shell", {"command": command})


def _running(engine: PrivateDockerd, instance: str, needle: str) -> list[str]:
    """The ids of the instance's running containers in which a process runs ``needle``."""
    client = engine.client()
    try:
        found = []
        for c in client.api.containers(filters={"label": f"{LABEL}={instance}"}):
            with contextlib.suppress(docker.errors.APIError):  # it stopped meanwhile
                # -ww: the whole command line (the engine's ps may cut it at 80 columns)
                rows = client.api.top(c["Id"], ps_args="-ww -o pid,args")["Processes"] or []
                if any(needle in " ".join(row) for row in rows):
                    found.append(c["Id"])
        return found
    finally:
        client.close()


def test_engine_goes_away_and_comes_back(tmp_path: Path, engine: PrivateDockerd) -> None:
    if engine.proc is None or engine.proc.poll() is not None:
        engine.start()
    instance = "faultsdown"
    with running_daemon(tmp_path, env=_env(engine, instance)) as d:
        first = _shell(d, "echo hi")
        assert first.status_code == 200 and first.json()["stdout"] == "hi\n", first.text
        wait_until(lambda: len(engine.containers(f"{LABEL}={instance}")) >= 2, timeout=60,
                   what="a full warm pool")
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            busy = [pool.submit(_shell, d, f"python3 -c '{SLEEPER}'") for _ in range(2)]
            wait_until(lambda: len(records(d.audit_path, "decision")) >= 3, timeout=20,
                       what="calls in flight")
            wait_until(lambda: len(_running(engine, instance, SLEEPER)) >= 2, timeout=60,
                       what="both calls' commands running in their containers")
            assert not any(f.done() for f in busy)
            engine.stop(signal.SIGTERM)  # the engine stops every container (Exited 143)
            answers = [f.result(timeout=120) for f in busy]
        # in-flight calls: results that say the engine went away, with the cleanup state: the
        # engine stops its containers before it exits and may still answer the daemon's
        # removal on a kept connection (then the removal is verified, and checked below once
        # the engine is back), else the container is left for when it is back
        said_removed = []
        for r in answers:
            assert r.status_code == 200, r.text
            result = r.json()
            assert result["status"] == "error", result
            assert "Docker engine" in result["message"], result
            cleanup = result["cleanup"]
            if cleanup["verified"]:
                name = re.fullmatch(r"container (\S+) removed", cleanup["detail"])
                assert name is not None, json.dumps(result)
                said_removed.append(name[1])
            else:
                assert "engine" in cleanup["detail"], json.dumps(result)
        # new calls: 503 problem+json with Retry-After; readiness and tools say why
        wait_until(lambda: not _shell_available(d), timeout=15,
                   what="the container backend marked down")
        r = _shell(d, "echo hi")
        assert r.status_code == 503, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert int(r.headers["retry-after"]) > 0
        assert _container_ready(d)["available"] is False
        # the engine returns: leftovers removed, pool refilled, calls work, none dead
        engine.start()
        wait_until(lambda: _shell_available(d), timeout=30, what="the container backend back")
        listed = [n.lstrip("/") for c in engine.containers(f"{LABEL}={instance}")
                  for n in c["Names"]]
        assert not set(said_removed) & set(listed), (said_removed, listed)  # truly removed

        def only_fresh_pool() -> bool:
            cs = engine.containers(f"{LABEL}={instance}")
            return len(cs) >= 1 and all(c["State"] == "running" for c in cs)
        def states() -> list[tuple[str, str, str]]:
            return [(c["Names"][0], c["State"], c["Labels"].get("sandboxd.role", "?"))
                    for c in engine.containers(f"{LABEL}={instance}")]
        wait_until(only_fresh_pool, timeout=60, what="leftovers removed and the pool refilled",
                   detail=states)
        for _ in range(4):
            r = _shell(d, "echo back")
            assert r.status_code == 200 and r.json()["status"] == "ok", r.text
            assert r.json()["stdout"] == "back\n"
        assert _container_ready(d)["ok"] is True
    wait_until(lambda: not engine.containers(f"{LABEL}={instance}"), timeout=30,
               what="no container left")


def test_daemon_started_while_engine_down(tmp_path: Path, engine: PrivateDockerd) -> None:
    engine.stop(signal.SIGTERM)
    instance = "faultsstart"
    with running_daemon(tmp_path, env=_env(engine, instance)) as d:
        assert not _shell_available(d)
        r = _shell(d, "echo hi")
        assert r.status_code == 503 and "retry-after" in r.headers, r.text
        engine.start()
        wait_until(lambda: _shell_available(d), timeout=30,
                   what="the container backend reconnected by itself")
        r = _shell(d, "echo hi")
        assert r.status_code == 200 and r.json()["stdout"] == "hi\n", r.text
    wait_until(lambda: not engine.containers(f"{LABEL}={instance}"), timeout=30,
               what="no container left")


READY_POLICY = """\
version: 1
name: ready
clients: ["*"]
limits: {timeout: 120s, max_timeout: 180s}
tools:
  python:
    backend: container
"""


def _ready_count(d: RunningDaemon) -> int:
    return int(d.client.get("/v1/capacity").json()["sessions"]["ready"])


def test_ready_sessions_are_remade_after_the_engine_comes_back(
        tmp_path: Path, engine: PrivateDockerd) -> None:
    """Sessions made ahead with their container started (``session_pool_size``) die with
    the engine: none is handed out meanwhile, and once it is back they are made anew, the
    dead ones removed, and a new session takes a working one."""
    if engine.proc is None or engine.proc.poll() is not None:
        engine.start()
    instance = "faultsready"
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "ready.yaml").write_text(READY_POLICY)
    env = _env(engine, instance) | {"SANDBOXD_WARM_POOL_SIZE": "0",
                                    "SANDBOXD_SESSION_POOL_SIZE": "2"}
    with running_daemon(tmp_path, env=env, policies_dir=policies) as d:
        wait_until(lambda: _ready_count(d) == 2, timeout=120, what="two ready sessions",
                   detail=d.log)
        before = {c["Labels"]["sandboxd.session"] for c in engine.containers(
            f"{LABEL}={instance}")}
        engine.stop(signal.SIGTERM)
        wait_until(lambda: _ready_count(d) == 0, timeout=30, what="no ready session while the "
                   "engine is away", detail=d.log)
        sid = d.client.post("/v1/sessions").json()["id"]
        assert sid not in before  # not one whose container died
        r = d.invoke("python", {"code": "print(1)"}, session=sid)
        assert r.status_code == 503 and int(r.headers["retry-after"]) > 0, r.text
        engine.start()
        wait_until(lambda: _ready_count(d) == 2, timeout=120, what="ready sessions made anew",
                   detail=d.log)

        def sessions_now() -> set[str]:
            return {c["Labels"].get("sandboxd.session", "") for c in engine.containers(
                f"{LABEL}={instance}")}
        wait_until(lambda: not sessions_now() & before, timeout=60,
                   what="the dead ready sessions' containers removed", detail=sessions_now)
        fresh = d.client.post("/v1/sessions").json()["id"]
        assert fresh in sessions_now()
        result = d.python(fresh, "print(6 * 7)")
        assert result["status"] == "ok" and result["stdout"] == "42\n", result
        assert not [p for p in (d.state_dir / "workspaces").iterdir() if p.name in before]
    wait_until(lambda: not engine.containers(f"{LABEL}={instance}"), timeout=60,
               what="no container left")
