"""The shipped systemd unit parses, scores within the exposure goal and keeps its hardening."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.unitfile import (
    EXPOSURE_GOAL,
    SYSTEMD_DIR,
    UNIT,
    exposure,
    parse_unit,
    systemd_analyze,
)

SHIPPED_BINARY = "/opt/sandboxd/bin/sandboxd"


def _installed_binary() -> str:
    """The console script of the package under test (what ExecStart= runs once installed)."""
    candidate = Path(sys.executable).parent / "sandboxd"
    assert candidate.exists(), f"{candidate} missing: is sandboxd installed in this venv?"
    return str(candidate)


def _stage(tmp_path: Path, *dropins: str) -> Path:
    """Copy the unit (ExecStart pointed at the installed script), slice and drop-ins to a unit
    directory, as `systemctl` would find them under /etc/systemd/system."""
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    binary = _installed_binary()
    for name in ("sandboxd.service", "sandboxd.slice"):
        text = (SYSTEMD_DIR / name).read_text().replace(SHIPPED_BINARY, binary)
        (unit_dir / name).write_text(text)
    if dropins:
        d = unit_dir / "sandboxd.service.d"
        d.mkdir()
        for name in dropins:
            text = (SYSTEMD_DIR / name).read_text().replace(SHIPPED_BINARY, binary)
            (d / name).write_text(text)
    return unit_dir


def _verify(unit_dir: Path, *units: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{unit_dir}:"}  # trailing ':' = plus defaults
    return subprocess.run(
        [systemd_analyze(), "verify", "--man=no", *units],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=unit_dir,
        check=False,
    )


def test_unit_verifies_cleanly(tmp_path: Path) -> None:
    unit_dir = _stage(tmp_path)
    proc = _verify(unit_dir, "sandboxd.service", "sandboxd.slice")
    # verify exits 0 on unknown keys ("ignoring") - any output at all is a defect.
    assert proc.returncode == 0 and not proc.stderr.strip() and not proc.stdout.strip(), (
        proc.stdout + proc.stderr
    )


def test_verify_catches_a_typo(tmp_path: Path) -> None:
    """The check above can fail: a misspelt key is reported."""
    unit_dir = _stage(tmp_path)
    unit = unit_dir / "sandboxd.service"
    unit.write_text(unit.read_text().replace("NoNewPrivileges=", "NoNewPrivilege="))
    proc = _verify(unit_dir, "sandboxd.service")
    assert "NoNewPrivilege" in proc.stderr


@pytest.mark.parametrize(
    "dropin",
    [
        "sandboxd-tcp.conf",
        "sandboxd-docker.conf",
        "sandboxd-docker-rootless.conf",
        "sandboxd-nonroot.conf",
        "sandboxd-quota.conf",
        "sandboxd-egress.conf",
    ],
)
def test_dropins_verify_cleanly(tmp_path: Path, dropin: str) -> None:
    unit_dir = _stage(tmp_path, dropin)
    proc = _verify(unit_dir, "sandboxd.service")
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr


def test_exposure_score_within_goal() -> None:
    score, out = exposure(UNIT)
    print(f"systemd-analyze security exposure of sandboxd.service: {score}")
    assert score <= EXPOSURE_GOAL, out


@pytest.mark.parametrize(
    ("dropin", "limit"),
    [
        # the Docker variants keep the goal
        ("sandboxd-docker.conf", EXPOSURE_GOAL),
        ("sandboxd-docker-rootless.conf", EXPOSURE_GOAL),
        # no capability at all, not root: well below the goal
        ("sandboxd-nonroot.conf", 1.0),
        # TCP needs the host's network namespace and AF_INET: +0.8 (documented trade-off)
        ("sandboxd-tcp.conf", EXPOSURE_GOAL + 0.8),
        # kernel-enforced workspace quotas need CAP_SYS_ADMIN and mount(): +0.4 (documented)
        ("sandboxd-quota.conf", EXPOSURE_GOAL + 0.4),
        # the egress proxy connects out: the host's network namespace and AF_INET, like TCP
        ("sandboxd-egress.conf", EXPOSURE_GOAL + 0.8),
    ],
)
def test_exposure_score_with_dropins(tmp_path: Path, dropin: str, limit: float) -> None:
    unit_dir = _stage(tmp_path, dropin)
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{unit_dir}:"}
    score, out = exposure(Path("sandboxd.service"), env=env)
    print(f"exposure with {dropin}: {score}")
    assert score <= limit, out
    if dropin == "sandboxd-tcp.conf":
        assert re.search(r"✗ PrivateNetwork=", out), "the drop-in was not applied"
    if dropin == "sandboxd-quota.conf":
        assert re.search(r"✗ CapabilityBoundingSet=~CAP_SYS_ADMIN", out), "not applied"


def test_exposure_parse_detects_a_weak_unit(tmp_path: Path) -> None:
    """The score check can fail: a bare unit scores far above the goal."""
    bare = tmp_path / "bare.service"
    bare.write_text("[Service]\nExecStart=/bin/true\n")
    score, _ = exposure(bare)
    assert score > EXPOSURE_GOAL


def test_key_options_present() -> None:
    service = parse_unit(UNIT.read_text())["Service"]

    def one(key: str) -> str:
        assert key in service, f"{key}= missing"
        return service[key][-1]

    assert one("Type") == "notify"
    assert one("NotifyAccess") == "main"
    assert one("Restart") == "on-failure"
    # root, but bounded: the workers need setuid/chroot to get a uid of their own.
    assert "User" not in service and "DynamicUser" not in service
    assert set(one("CapabilityBoundingSet").split()) == {
        "CAP_SETUID",
        "CAP_SETGID",
        "CAP_SYS_CHROOT",
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_KILL",
    }
    assert "--uds /run/sandboxd/sandboxd.sock" in one("ExecStart")
    assert one("ExecStart").split()[:2] == [SHIPPED_BINARY, "serve"]
    # paths come from the shipped config file, which admin commands read too
    env = dict(v.split("=", 1) for v in service["Environment"])
    assert not any(k.startswith("SANDBOXD_") for k in env)
    from sandboxd.config import load_settings

    shipped = load_settings(SYSTEMD_DIR / "sandboxd.yaml")
    assert shipped.state_dir == Path("/var/lib/sandboxd")
    assert shipped.audit_path == Path("/var/log/sandboxd/audit.jsonl")
    assert shipped.policies_dir == Path("/etc/sandboxd/policies")
    assert set(service["ReadWritePaths"][0].split()) >= {"/var/lib/sandboxd", "/var/log/sandboxd"}
    for key in (
        "NoNewPrivileges",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "LockPersonality",
        "MemoryDenyWriteExecute",
        "RestrictNamespaces",
        "RestrictSUIDSGID",
        "RestrictRealtime",
        "PrivateNetwork",
        "Delegate",
    ):
        assert one(key) == "yes", key
    assert one("ProtectSystem") == "strict"
    assert set(one("ReadWritePaths").split()) == {
        "/var/lib/sandboxd",
        "/var/log/sandboxd",
        "/run/sandboxd",
        "-/run/sandboxd-uids",
    }
    assert one("AmbientCapabilities") == ""
    assert one("UMask") == "0077"
    assert one("Slice") == "sandboxd.slice"
    assert set(one("RestrictAddressFamilies").split()) <= {"AF_UNIX", "AF_INET", "AF_INET6"}
    filters = service["SystemCallFilter"]
    allowed = filters[0].split()
    assert allowed[0] == "@system-service"
    assert "seccomp" in allowed, "workers load their own seccomp filter"
    assert "chroot" in allowed, "workers chroot into their workspace"
    denied = " ".join(f[1:] for f in filters[1:] if f.startswith("~")).split()
    for name in (
        "@debug",
        "@module",
        "@raw-io",
        "@reboot",
        "@swap",
        "@clock",
        "@obsolete",
        "mount",
        "pivot_root",
        "bpf",
        "capset",
        "open_by_handle_at",
    ):
        assert name in denied, name
    # The backend writes cgroups in its delegated subtree: ProtectControlGroups would forbid it.
    assert "ProtectControlGroups" not in service


def test_hardening_as_systemd_sees_it() -> None:
    """systemd-analyze's own reading of the unit (not our parser) confirms the key settings."""
    _, out = exposure(UNIT)
    for check in (
        "NoNewPrivileges=",
        "ProtectSystem=",
        "ProtectHome=",
        "PrivateTmp=",
        "PrivateDevices=",
        "PrivateNetwork=",
        "ProtectKernelTunables=",
        "ProtectKernelModules=",
        "ProtectKernelLogs=",
        "MemoryDenyWriteExecute=",
        "LockPersonality=",
        "RestrictSUIDSGID=",
        "CapabilityBoundingSet=~CAP_SYS_ADMIN",
        "CapabilityBoundingSet=~CAP_SYS_PTRACE",
        "CapabilityBoundingSet=~CAP_NET_ADMIN",
        "SystemCallFilter=~@debug",
        "SystemCallFilter=~@module",
        "SystemCallFilter=~@raw-io",
        "RestrictNamespaces=~user",
        "UMask=",
    ):
        line = next((ln for ln in out.splitlines() if ln[2:].startswith(check)), None)
        assert line is not None, f"{check} not in systemd-analyze output"
        assert line.startswith("✓"), line


def test_sysusers_and_tmpfiles_create_the_layout(tmp_path: Path) -> None:
    """systemd-sysusers / systemd-tmpfiles apply our snippets to a scratch root."""
    root = tmp_path / "root"
    (root / "usr/lib/sysusers.d").mkdir(parents=True)
    (root / "usr/lib/tmpfiles.d").mkdir(parents=True)
    (root / "etc").mkdir()
    shutil.copy(SYSTEMD_DIR / "sandboxd.sysusers", root / "usr/lib/sysusers.d/sandboxd.conf")
    shutil.copy(SYSTEMD_DIR / "sandboxd.tmpfiles", root / "usr/lib/tmpfiles.d/sandboxd.conf")
    sysusers = shutil.which("systemd-sysusers")
    tmpfiles = shutil.which("systemd-tmpfiles")
    assert sysusers and tmpfiles, "systemd-sysusers / systemd-tmpfiles missing (apt: systemd)"
    subprocess.run([sysusers, f"--root={root}", "sandboxd.conf"], check=True, timeout=60)
    users = {
        line.split(":")[0]: line.split(":")
        for line in (root / "etc/passwd").read_text().splitlines()
    }
    assert users["sandboxd-code"][2:4] == ["10001", "10001"]
    assert users["sandboxd-code"][6] == "/usr/sbin/nologin"
    assert 0 < int(users["sandboxd"][2]) < 1000, "the non-root drop-in's user is a system user"
    assert users["sandboxd"][6] == "/usr/sbin/nologin"
    subprocess.run(
        [tmpfiles, f"--root={root}", "--create", "sandboxd.conf"], check=True, timeout=60
    )
    for rel, mode in (
        ("var/lib/sandboxd", 0o700),
        ("var/lib/sandboxd/workspaces", 0o700),
        ("var/log/sandboxd", 0o750),
        ("run/sandboxd", 0o755),
        ("run/sandboxd-uids", 0o755),
        ("etc/sandboxd/policies", 0o755),
    ):
        st = (root / rel).stat()
        assert st.st_uid == 0, rel
        assert st.st_mode & 0o7777 == mode, f"{rel}: {oct(st.st_mode)}"
