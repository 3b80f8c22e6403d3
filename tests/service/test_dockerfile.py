"""The daemon's own Dockerfile: build it offline (host wheels, offline base image), run it
non-root with no capabilities, and serve a `python` call from it over HTTP."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandboxd.config import Settings

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
DAEMON_UID = 10000
CONTEXT_FILES = (
    "pyproject.toml",
    "README.md",
    "sandboxd",
    "policies",
    "Dockerfile",
    ".dockerignore",
)
TEST_LABEL = "sandboxd.test.dockerfile"


def _context(tmp: Path) -> Path:
    """A private build context (concurrent runs never share dist/wheels) with host wheels."""
    ctx = tmp / "ctx"
    ctx.mkdir()
    for name in CONTEXT_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, ctx / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, ctx / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--wheel-dir",
            str(ctx / "dist" / "wheels"),
            str(ctx),
            "pip",
        ],
        check=True,
        timeout=600,
        capture_output=True,
    )
    return ctx


@pytest.fixture(scope="module")
def daemon_image(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Build the Dockerfile FROM the offline base image (the sandbox python image)."""
    ctx = _context(tmp_path_factory.mktemp("dockerfile"))
    tag = f"sandboxd-daemon-test:{uuid.uuid4().hex[:10]}"
    base = Settings().python_image
    try:
        docker_client.images.build(
            path=str(ctx),
            tag=tag,
            buildargs={"BASE": base},
            rm=True,
            forcerm=True,
            labels={TEST_LABEL: "1"},
            timeout=900,
        )
    except Exception as exc:
        log = "".join(
            str(chunk.get("stream", chunk.get("error", "")))
            for chunk in getattr(exc, "build_log", []) or []
        )
        pytest.fail(f"docker build failed: {exc}\n{log[-4000:]}")
    yield tag
    docker_client.images.remove(tag, force=True)


def _owned_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    os.chown(path, DAEMON_UID, DAEMON_UID)
    path.chmod(0o750)
    return path


@pytest.fixture
def container(docker_client: Any, daemon_image: str, tmp_path: Path) -> Iterator[Any]:
    """The daemon container run with the documented flags: read-only rootfs, no capabilities,
    no-new-privileges, its unix socket / state / logs in host directories."""
    run_dir, state, logs = (_owned_dir(tmp_path / n) for n in ("run", "state", "logs"))
    c = docker_client.containers.run(
        daemon_image,
        detach=True,
        name=f"sandboxd-daemon-test-{uuid.uuid4().hex[:10]}",
        labels={TEST_LABEL: "1"},
        read_only=True,
        tmpfs={"/tmp": "rw,nosuid,nodev,size=64m"},
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        network_mode="none",
        mem_limit="1g",
        pids_limit=256,
        volumes={
            str(run_dir): {"bind": "/run/sandboxd", "mode": "rw"},
            str(state): {"bind": "/var/lib/sandboxd", "mode": "rw"},
            str(logs): {"bind": "/var/log/sandboxd", "mode": "rw"},
        },
        # The image's own HEALTHCHECK command, polled faster for the test.
        healthcheck={
            "interval": 1_000_000_000,
            "start_period": 60_000_000_000,
            "timeout": 15_000_000_000,
            "retries": 3,
        },
    )
    c.run_dir, c.state_dir, c.log_dir = run_dir, state, logs
    try:
        yield c
    finally:
        c.remove(force=True)


def _wait_for_socket(c: Any, sock: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not sock.exists():
        c.reload()
        if c.status == "exited" or time.monotonic() > deadline:
            pytest.fail(
                f"daemon container did not listen ({c.status}):\n"
                f"{c.logs().decode(errors='replace')[-4000:]}"
            )
        time.sleep(0.2)


def test_image_serves_a_python_call(container: Any) -> None:
    sock = container.run_dir / "sandboxd.sock"
    _wait_for_socket(container, sock)
    transport = httpx.HTTPTransport(uds=str(sock))
    with httpx.Client(base_url="http://sandboxd", transport=transport, timeout=120) as client:
        assert client.get("/healthz").status_code == 200
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        response = client.post(
            "/v1/tools/python/invoke",
            json={"arguments": {"code": "import math\nprint('hi')\nmath.factorial(10)"}},
        )
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["status"] == "ok", result
    assert result["backend"] == "restricted"
    assert result["stdout"] == "hi\n"
    assert result["value"] == 3628800
    assert result["cleanup"]["verified"] is True
    # The audit log landed in the mounted log directory, written by the non-root user.
    audit = container.log_dir / "audit.jsonl"
    assert audit.exists() and audit.stat().st_uid == DAEMON_UID


def test_image_is_non_root_and_healthy(container: Any) -> None:
    _wait_for_socket(container, container.run_dir / "sandboxd.sock")
    container.reload()
    assert container.attrs["Config"]["User"].split(":")[0] == "sandboxd"
    top = container.top(ps_args="-o uid,pid,comm")
    uids = {int(p[0]) for p in top["Processes"]}
    assert uids == {DAEMON_UID}, top
    deadline = time.monotonic() + 120
    health = ""
    while time.monotonic() < deadline:
        container.reload()
        health = container.attrs["State"].get("Health", {}).get("Status", "")
        if health in ("healthy", "unhealthy"):
            break
        time.sleep(1)
    assert health == "healthy", container.attrs["State"].get("Health")


def test_sigterm_stops_cleanly(container: Any) -> None:
    _wait_for_socket(container, container.run_dir / "sandboxd.sock")
    container.stop(timeout=60)  # SIGTERM (STOPSIGNAL), then SIGKILL after 60 s
    container.reload()
    assert container.attrs["State"]["ExitCode"] == 0, container.logs().decode()[-3000:]
    assert not (container.run_dir / "sandboxd.sock").exists(), "socket left behind"
