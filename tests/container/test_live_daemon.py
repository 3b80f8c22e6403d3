"""Admin commands are guests in a live daemon's house (they must not break it): ``sandboxd
doctor`` beside a serving daemon removes none of its containers or files, and what vanishes under a
live daemon anyway (its runner directory, its containers) makes calls a 503 and the daemon not ready
until it has rebuilt them by itself."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import httpx
import pytest

from tests.support import cli
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.wait import wait_until

from .conftest import labelled
from .test_http import daemon_env, policies  # noqa: F401  (a fixture)

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = [pytest.mark.docker, pytest.mark.same_on_every_host(
    "what the doctor leaves alone and how a daemon rebuilds what vanished is their own logic; "
    "the VM's service job runs the doctor beside the shipped unit's live daemon "
    "(doctor-finds-unit-audit-log, doctor-twice) and test_statelock beside a live serve")]


@pytest.fixture
def state() -> Iterator[Path]:
    """A state directory with a short path: the runner directory is then ``<state>/run``
    (a socket path must fit in 108 bytes; pytest's temporary paths are too long)."""
    path = Path(tempfile.mkdtemp(prefix="sbx-"))
    yield path / "state"
    shutil.rmtree(path, ignore_errors=True)


def _ids(docker_client: Any, instance: str) -> set[str]:
    return {c.id for c in labelled(docker_client, instance)}


def _pool_ready(docker_client: Any, instance: str) -> set[str]:
    """Ids of the daemon's running warm-pool containers (waited for: at least one)."""
    def running() -> set[str]:
        return {c.id for c in labelled(docker_client, instance)
                if c.labels.get("sandboxd.role") == "pool" and c.status == "running"}
    return wait_until(running, timeout=120, what="a running warm-pool container")


def _python(d: RunningDaemon, code: str, session: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {"session": session} if session else {}
    return d.invoke("python", {"code": code}, **body)


def test_doctor_beside_a_live_daemon_removes_nothing(
        docker_client: Any, tmp_path: Path, policies: Path, state: Path) -> None:  # noqa: F811
    instance = f"live{secrets.token_hex(4)}"
    env = daemon_env(instance)
    with running_daemon(tmp_path, policies_dir=policies, env=env, state_dir=state) as d:
        sid = d.client.post("/v1/sessions", json={}).json()["id"]
        r = _python(d, "x = 41\nx", session=sid)
        assert r.status_code == 200 and r.json()["value"] == 41, r.text
        pool = _pool_ready(docker_client, instance)
        before = _ids(docker_client, instance)
        assert before > pool and len(before) >= 2, before  # the session's container and the pool's
        rundir = d.state_dir / "run"
        assert rundir.is_dir()

        # exactly as `make run` prints it, with the daemon's settings; its own TMPDIR, as
        # other test workers run doctors in /tmp
        scratch = tmp_path / "doctor-tmp"
        scratch.mkdir()
        doctor = cli.run(
            "doctor", "--state-dir", str(d.state_dir), "--backend", "container", timeout=300,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")},
                 "SANDBOXD_CONFIG": os.devnull, "TMPDIR": str(scratch), **env})
        out = doctor.stdout + doctor.stderr
        assert doctor.returncode == 0, out
        assert "left by a previous run" not in out, out  # main swept them here
        lock = d.state_dir / "daemon.lock"
        assert f"a daemon holds {lock}, pid {d.proc.pid}" in doctor.stdout, out
        assert f"would remove {len(before)} container(s) labelled sandboxd.daemon={instance}" \
            in doctor.stdout, out
        assert f"{rundir}/" in doctor.stdout, out

        # nothing of the daemon's is gone: containers, runner directory, session kernel
        assert before <= _ids(docker_client, instance)
        assert rundir.is_dir()
        r = _python(d, "x + 1", session=sid)
        assert r.status_code == 200 and r.json()["value"] == 42, r.text
        assert r.json()["kernel"]["lost"] is False, r.text
        r = _python(d, "6 * 7")
        assert r.status_code == 200 and r.json()["value"] == 42, r.text
        assert list(scratch.iterdir()) == []
    assert labelled(docker_client, instance) == []


def _not_ready(d: RunningDaemon) -> dict[str, Any]:
    r = d.client.get("/readyz")
    assert r.status_code == 503, (r.text, d.log()[-4000:])
    body: dict[str, Any] = r.json()
    assert body["ready"] is False and body["backends"]["container"]["available"] is False
    return body


def test_runner_directory_and_containers_vanish_under_a_live_daemon(
        docker_client: Any, tmp_path: Path, policies: Path, state: Path) -> None:  # noqa: F811
    instance = f"heal{secrets.token_hex(4)}"
    with running_daemon(tmp_path, policies_dir=policies, env=daemon_env(instance),
                        state_dir=state) as d:
        assert _python(d, "1").json()["value"] == 1
        _pool_ready(docker_client, instance)
        rundir = d.state_dir / "run"

        def vandalise() -> None:  # what the doctor of main did: docker rm -f, rm -rf run/
            for c in labelled(docker_client, instance):
                # a one-shot call's container may be gone already, or its removal under
                # way (409): the daemon removes it after the result (docs/operations.md)
                try:
                    c.remove(force=True)
                except docker.errors.APIError as exc:
                    if exc.status_code not in (404, 409):
                        raise
            shutil.rmtree(rundir)  # last: the daemon rebuilds a second after it notices

        # 1. plain: the next call is a clear 503 (no path, no 500); then it heals by itself
        vandalise()
        r = _python(d, "6 * 7")
        assert r.status_code == 503, r.text
        problem = r.json()
        assert problem["type"].endswith("/tool-unavailable") and r.headers["retry-after"]
        assert "recovering" in problem["detail"] and str(rundir) in problem["detail"], problem
        wait_until(lambda: d.client.get("/readyz").status_code == 200, timeout=120,
                   what="/readyz ready again after the rebuild")
        r = _python(d, "6 * 7")
        assert r.status_code == 200 and r.json()["value"] == 42, r.text
        assert rundir.is_dir()
        _pool_ready(docker_client, instance)

        # 2. something in the way of the rebuild: not ready, calls 503, until it is gone
        vandalise()
        rundir.write_text("not a directory\n")
        r = _python(d, "6 * 7")
        assert r.status_code == 503 and "recovering" in r.json()["detail"], r.text
        body = _not_ready(d)
        assert str(rundir) in body["backends"]["container"]["reason"], body
        assert _python(d, "1").status_code == 503
        _not_ready(d)
        rundir.unlink()
        wait_until(lambda: d.client.get("/readyz").status_code == 200, timeout=120,
                   what="/readyz ready once the rebuild could proceed")
        r = _python(d, "6 * 7")
        assert r.status_code == 200 and r.json()["value"] == 42, r.text
        assert "container" in r.json()["backend"]
        log = d.log()
        assert "container backend recovered" in log, log[-3000:]
    assert labelled(docker_client, instance) == []
