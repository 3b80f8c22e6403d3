"""``make clean`` (``sandboxd clean``) after a stop that kept a session: the session's tmpfs
workspace is still mounted and its container still runs, where a plain ``rm -rf`` fails; the
command unmounts, removes the container and the directory. While a daemon serves that
directory it refuses in one line and removes nothing."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd.workspaces.quota import mounts_below
from tests.support.ci import require
from tests.support.daemon import daemon_list, start_daemon, uid_range_env
from tests.support.mounts import detach_below

from .conftest import labelled
from .test_http import SLOW_ENGINE, daemon_env, policies  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.docker, pytest.mark.same_on_every_host(
    "make clean is a developer's command on the host that ran make run")]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def state() -> Iterator[Path]:
    """A short state path (runner sockets below it); no mount outlives the test."""
    path = Path(tempfile.mkdtemp(prefix="sbx-"))
    yield path / "state"
    left = detach_below(path)
    shutil.rmtree(path, ignore_errors=True)
    assert left == [], "a mount outlived the test"


def _make_clean(state: Path, where: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The Makefile's clean target on ``state``, run in ``where`` (its caches and virtualenv
    are looked for there: the checkout's own stay) with a virtualenv whose ``sandboxd`` is
    this one's."""
    venv = where / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "sandboxd").symlink_to(Path(sys.executable).parent / "sandboxd")
    return subprocess.run(["make", "--no-print-directory", "-f", str(REPO / "Makefile"),
                           "clean", f"STATE={state}", f"VENV={venv}"],
                          cwd=where, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def test_make_clean_after_a_stop_that_kept_a_session(
        docker_client: Any, tmp_path: Path, policies: Path, state: Path) -> None:  # noqa: F811
    require(os.geteuid() == 0, "tmpfs workspaces need root")
    instance = f"cln{secrets.token_hex(4)}"
    env = {**daemon_env(instance), "SANDBOXD_SESSIONS_SURVIVE_RESTART": "true",
           **uid_range_env()}
    admin = {**{k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")},
             "SANDBOXD_CONFIG": os.devnull, "SANDBOXD_INSTANCE": instance}
    try:
        with daemon_list() as started:
            d = start_daemon(tmp_path, policies_dir=policies, state_dir=state, env=env)
            started.append(d)
            sid = d.client.post("/v1/sessions").json()["id"]
            body = d.invoke("python", {"code": "open('notes.txt', 'w').write('kept')"},
                            session=sid, limits=SLOW_ENGINE).json()
            assert body["status"] == "ok" and body["backend"] == "container", body

            refused = _make_clean(state, tmp_path / "live", admin)
            assert refused.returncode != 0
            said = [line for line in refused.stderr.splitlines() if line.startswith("sandboxd")]
            assert len(said) == 1 and re.fullmatch(
                rf"sandboxd: clean refused: a daemon \(pid \d+\) serves {re.escape(str(state))}; "
                "stop it first", said[0]), said
            assert (state / "workspaces" / sid / "notes.txt").read_text() == "kept"
            assert d.stop() == 0

        assert mounts_below(state) == [state / "workspaces" / sid]  # kept for the next start
        assert [c.labels.get("sandboxd.role") for c in labelled(docker_client, instance)] == [
            "session"]
        rm = subprocess.run(["rm", "-rf", str(state)], capture_output=True, text=True,
                            check=False)
        assert rm.returncode != 0 and "busy" in rm.stderr  # what make clean did before

        done = _make_clean(state, tmp_path / "stopped", admin)
        assert done.returncode == 0, done.stdout + done.stderr
        assert not state.exists()
        assert mounts_below(state.parent) == []
        assert labelled(docker_client, instance) == []
        assert not (tmp_path / "stopped" / "venv").exists()
    finally:
        for c in labelled(docker_client, instance):
            c.remove(force=True)
