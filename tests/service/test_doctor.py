"""`sandboxd doctor` runs the real backends' probes in-process and reports every check."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support import cli

ENV_KEEP = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}


def _doctor(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, config: str | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = ["doctor", "--state-dir", str(tmp_path / "state")]
    if config is not None:
        path = tmp_path / "sandboxd.yaml"
        path.write_text(config)
        cmd += ["--config", str(path)]
    return cli.run(*cmd, *args, timeout=300,
                   env={**ENV_KEEP, "SANDBOXD_CONTAINER_ENABLED": "false", **(env or {})})


def test_restricted_backend_passes_every_check(tmp_path: Path) -> None:
    proc = _doctor(tmp_path, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is True and data["default_backend"] == "restricted"
    (report,) = data["backends"]
    assert report["backend"] == "restricted" and report["available"] and report["ok"]
    names = {c["name"] for c in report["checks"]}
    assert len(names) >= 3, names  # socket, write outside, memory, privileges, seccomp...
    assert all(c["ok"] for c in report["checks"]), report["checks"]
    assert {c["name"] for c in data["host"]} >= {"user", "cgroup", "libseccomp", "state_dir"}


def test_table_names_every_check(tmp_path: Path) -> None:
    as_json = json.loads(_doctor(tmp_path / "a", "--json").stdout)
    proc = _doctor(tmp_path / "b")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["BACKEND", "CHECK", "RESULT", "DETAIL"]
    for check in as_json["backends"][0]["checks"]:
        assert any(ln.split()[:3] == ["restricted", check["name"], "ok"] for ln in lines), check
    assert "ok: default backend 'restricted': confinement holds" in proc.stdout


def test_root_sandbox_identity_is_refused(tmp_path: Path) -> None:
    """Told to run code as root (a uid pool starting at 0), the settings are refused with one
    clear line before any backend starts (the daemon would refuse the same way)."""
    proc = _doctor(tmp_path, env={"SANDBOXD_SANDBOX_UID_FIRST": "0"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "sandbox_uid_first" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_default_backend_disabled_fails(tmp_path: Path) -> None:
    proc = _doctor(tmp_path, config="restricted_enabled: false\ncontainer_enabled: false\n")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the default backend 'restricted' is disabled" in proc.stdout


def test_bad_input_is_one_clear_line(tmp_path: Path) -> None:
    proc = _doctor(tmp_path, config="- not\n- a mapping\n")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "must be a mapping" in proc.stderr
    proc = _doctor(tmp_path, "--backend", "bogus")
    assert proc.returncode == 2 and "unknown backend 'bogus'" in proc.stderr
    proc = _doctor(tmp_path, "--backend", "container")  # disabled via the environment
    assert proc.returncode == 2 and "disabled" in proc.stderr


@pytest.mark.docker
def test_container_backend_probe(tmp_path: Path, docker_client: object) -> None:
    proc = _doctor(
        tmp_path,
        "--backend",
        "container",
        "--json",
        "--strict",
        env={"SANDBOXD_CONTAINER_ENABLED": "true", "SANDBOXD_INSTANCE": f"doctor-{os.getpid()}"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    (report,) = data["backends"]
    assert report["backend"] == "container" and report["ok"], report
    assert all(c["ok"] for c in report["checks"]) and report["checks"]


def test_the_user_row_names_the_uids_sandboxes_run_as(tmp_path: Path) -> None:
    """The host's ``user`` row says what the daemon does: as root, every sandbox runs as its
    own uid of the configured range, as the restricted probe's sandbox did."""
    from sandboxd.host import uidclaim

    count = 50
    # far above where daemons of parallel tests look for a free range (from the default up)
    first = uidclaim.free_range(count, start=50000) if os.geteuid() == 0 else 50000
    assert first is not None
    data = json.loads(_doctor(tmp_path, "--json", env={
        "SANDBOXD_SANDBOX_UID_FIRST": str(first),
        "SANDBOXD_SANDBOX_UID_COUNT": str(count)}).stdout)
    user = next(c["detail"] for c in data["host"] if c["name"] == "user")
    probe = next(c["detail"] for c in data["backends"][0]["checks"]
                 if c["name"] == "unprivileged")
    if os.geteuid() != 0:
        assert "restricted workers keep this uid" in user, user
        return
    assert f"own uid (= gid) of {first}-{first + count - 1}" in user, user
    ran_as = int(probe.split()[-1])
    assert first <= ran_as < first + count, (probe, user)
