"""The daemon holds a lock on its state directory (``<state>/daemon.lock``, so that two daemons
never share one): a second ``serve`` there refuses to start with one line naming the directory and
the holder's pid, and the admin commands see the live daemon and leave its things alone."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import cli
from tests.support.daemon import free_port, running_daemon

pytestmark = pytest.mark.same_on_every_host(
    "the state directory's lock is one file's flock (the kernel's) and the doctor's reading of "
    "it; the service job runs the doctor beside the unit's live daemon (doctor-from-shell, "
    "doctor-twice) and a second daemon beside it (uid-range-claimed-host-wide)")

ENV = {"SANDBOXD_CONTAINER_ENABLED": "false"}


def _sandboxd(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    return cli.run(*args, timeout=300,
                   env={**env, "SANDBOXD_CONFIG": os.devnull, **ENV})


def test_a_second_serve_refuses_and_the_doctor_leaves_a_live_daemons_state(
        tmp_path: Path) -> None:
    """One daemon for both (a daemon start costs 20-60 s under the VM job's emulation): a second
    ``serve`` on its state directory refuses; ``doctor`` names it and sweeps nothing of it; once
    it stopped, the doctor sweeps and a new daemon may take the directory."""
    from sandboxd.host import statelock

    with running_daemon(tmp_path, env=ENV) as d:
        lock = d.state_dir / "daemon.lock"
        assert lock.read_text().strip() == str(d.proc.pid)
        second = _sandboxd("serve", "--port", str(free_port()), "--state-dir", str(d.state_dir))
        assert second.returncode == 5, second.stdout + second.stderr
        assert second.stderr.count("\n") == 1, second.stderr
        assert str(d.state_dir) in second.stderr and f"pid {d.proc.pid}" in second.stderr
        assert "in use by another sandboxd daemon" in second.stderr
        # the first one serves on, its lock file still names it
        r = d.invoke("python", {"code": "6 * 7"})
        assert r.status_code == 200 and r.json()["value"] == 42, r.text
        assert lock.read_text().strip() == str(d.proc.pid)
        assert statelock.holder(d.state_dir) == statelock.Holder(lock, d.proc.pid)
        # the doctor names the live daemon and leaves its state
        probe_left = d.state_dir / "restricted-probe-leftover"  # as a crash would leave it
        probe_left.mkdir()
        doctor = _sandboxd("doctor", "--state-dir", str(d.state_dir))
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert f"a daemon holds {d.state_dir / 'daemon.lock'}, pid {d.proc.pid}" in doctor.stdout
        assert f"would remove {probe_left}" in doctor.stdout, doctor.stdout
        assert probe_left.is_dir()  # a live daemon's state is not the doctor's to sweep
        r = d.invoke("python", {"code": "1 + 1"})
        assert r.status_code == 200 and r.json()["value"] == 2, r.text
    # the lock goes with the process
    assert statelock.holder(d.state_dir) is None
    # no daemon: the doctor sweeps what is left, holding the lock meanwhile
    doctor = _sandboxd("doctor", "--state-dir", str(d.state_dir))
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "a daemon holds" not in doctor.stdout and not probe_left.exists()
    # a new daemon may take the directory
    with running_daemon(tmp_path, env=ENV, state_dir=d.state_dir) as again:
        assert again.client.get("/readyz").status_code == 200
