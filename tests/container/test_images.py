"""`sandboxd images build` and the offline builder's mirror detection."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sandboxd.cli.images import images_dir, runner_digest
from sandboxd.config import Settings

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = pytest.mark.same_on_every_host(
    "the image builder's CLI, its mirror detection and the image's contents: the same on any "
    "host (the VM's engine runs the image the payload carries)")

SCRIPT = images_dir() / "offline" / "build-rootfs.sh"


def detect(apt_etc: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), "--print-mirror"], capture_output=True, text=True,
                          env={"APT_ETC": str(apt_etc), "SUITE": "bookworm",
                               "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}, check=False)


def test_mirror_from_one_line_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb http://security.example/debian-security bookworm-security main\n"
        "deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://mirror.example/debian "
        "bookworm main contrib\n")
    res = detect(tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "http://mirror.example/debian"


def test_mirror_from_deb822_sources(tmp_path: Path) -> None:
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(
        "Types: deb\nURIs: http://updates.example/debian\nSuites: bookworm-updates\n"
        "Components: main\n\n"
        "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n\n"
        "# the one to use\nTypes: deb-src deb\nURIs: http://deb822.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n")
    res = detect(tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "http://deb822.example/debian"


def test_no_mirror_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    res = detect(tmp_path)
    assert res.returncode == 1
    assert "no apt source for 'bookworm' found; set MIRROR" in res.stderr


def test_build_if_missing_is_idempotent_and_fast(docker_client: Any) -> None:
    cmd = [sys.executable, "-m", "sandboxd", "images", "build", "--if-missing"]
    first = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    assert first.returncode == 0, first.stderr
    started = time.monotonic()
    second = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "is up to date" in second.stdout
    assert time.monotonic() - started < 30  # no rebuild happened (no timing claim beyond that)
    image = docker_client.images.get(Settings().python_image)
    assert image.labels["sandboxd.runner.sha256"] == runner_digest(images_dir())
    assert image.attrs["Config"]["User"] == "10001:10001"
    assert image.attrs["Config"]["WorkingDir"] == "/workspace"


def test_image_has_the_tools_the_default_policy_allows(docker_client: Any) -> None:
    out = docker_client.containers.run(
        Settings().python_image, entrypoint=["sh", "-c"],
        command=["for p in ls cat head tail wc grep echo sort uniq cut tr diff pwd date seq "
                 "nl basename dirname stat du mkdir touch cp mv rm true false python3 git sed; "
                 "do command -v $p >/dev/null || echo missing $p; done; "
                 "find / -xdev -perm /6000 -type f 2>/dev/null; true"],
        remove=True, network_mode="none")
    assert out.decode() == "", out.decode()
