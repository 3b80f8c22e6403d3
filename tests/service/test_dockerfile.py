"""The daemon's own Dockerfile: build it offline (host wheels, offline base image), run it
non-root with no capabilities, and serve a `python` call from it over HTTP."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandboxd.config import Settings
from sandboxd.host import uidclaim
from tests.support import dockerfile_image
from tests.support.daemon import uid_range_env
from tests.support.wait import wait_until

# The first test also builds the image (session fixture, counted in its timeout): minutes under
# software emulation (the modern-host VM job), hence more than pytest's default 300 s.
pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]

TEST_LABEL = dockerfile_image.TEST_LABEL


def _prebuilt(docker_client: Any) -> str | None:
    """The image the modern-host VM's payload ships (tests/support/dockerfile_image.py), when it
    was built from these very sources; else None (the fixture builds it)."""
    tag = os.environ.get(dockerfile_image.PREBUILT_ENV)
    if not tag:
        return None
    try:
        found = docker_client.images.get(tag).labels or {}
    except Exception:
        return None
    if found.get(dockerfile_image.SOURCE_LABEL) != dockerfile_image.source_digest():
        return None
    return tag


@pytest.fixture(scope="module")
def daemon_image(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Build the Dockerfile FROM the offline base image (the sandbox python image); in the VM,
    the same build made once on the host when its sources are these (tests/vm/README.md)."""
    prebuilt = _prebuilt(docker_client)
    if prebuilt:
        yield prebuilt
        return
    ctx = dockerfile_image.make_context(tmp_path_factory.mktemp("dockerfile"))
    tag = f"sandboxd-daemon-test:{uuid.uuid4().hex[:10]}"
    base = Settings().python_image
    try:
        docker_client.images.build(
            path=str(ctx),
            tag=tag,
            buildargs={"BASE": base},
            rm=True,
            forcerm=True,
            labels=dockerfile_image.labels(),
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
    docker_client.images.prune(filters={"dangling": True, "label": "org.sandboxd.stage=build"})


DAEMON_CAPS = ["SETUID", "SETGID", "SYS_CHROOT", "CHOWN", "DAC_OVERRIDE", "KILL"]
CAP_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "KILL": 5, "SETGID": 6, "SETUID": 7, "SYS_CHROOT": 18}
CGROUP = Path("/sys/fs/cgroup")


def _cgroup_flags(docker_client: Any, name: str) -> tuple[dict[str, Any], list[Path]]:
    """The documented run flags that give the daemon a writable cgroup subtree: on v1 only the
    subtree its container lives in (--cgroup-parent), on v2 the host tree (cgroupns=host)."""
    driver = docker_client.info().get("CgroupDriver", "cgroupfs")
    parent = f"{name}.slice" if driver == "systemd" else f"/{name}"
    if (CGROUP / "cgroup.controllers").exists():
        return {
            "cgroup_parent": parent,
            "cgroupns": "host",
            "volumes": {str(CGROUP): {"bind": str(CGROUP), "mode": "rw"}},
        }, [CGROUP / _slice_path(parent) if driver == "systemd" else CGROUP / name]
    dirs = [CGROUP / c / name for c in ("memory", "cpu", "pids")]
    for d in dirs:
        d.mkdir()
    volumes = {str(d): {"bind": f"/host-cgroup/{d.parent.name}/{name}", "mode": "rw"} for d in dirs}
    return {
        "cgroup_parent": parent,
        "environment": {"SANDBOXD_CGROUP_ROOT": "/host-cgroup"},
        "volumes": volumes,
    }, dirs


def _slice_path(unit: str) -> str:
    """Where systemd puts a slice: ``a-b-c.slice`` is ``a.slice/a-b.slice/a-b-c.slice``."""
    parts = unit.removesuffix(".slice").split("-")
    return "/".join("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


def _remove_cgroups(name: str, dirs: list[Path]) -> None:
    """Remove what a daemon container ``name`` had of cgroups once it is gone: the subtree it
    was given and, on v1, the parent the engine made for ``--cgroup-parent`` in every
    hierarchy (the engine removes the container's cgroup, never that parent)."""
    for d in dirs:
        if d != CGROUP:
            _remove_cgroup_tree(d)
    if not (CGROUP / "cgroup.controllers").exists():
        for hierarchy in CGROUP.iterdir():
            if hierarchy.is_dir() and not hierarchy.is_symlink():
                _remove_cgroup_tree(hierarchy / name)


def _remove_cgroup_tree(d: Path) -> None:
    def removed() -> bool:
        if not d.exists():
            return True
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(str(p))):
            with contextlib.suppress(OSError):
                sub.rmdir()
        with contextlib.suppress(OSError):
            d.rmdir()
        return not d.exists()

    with contextlib.suppress(AssertionError):  # best effort: a clean-up
        wait_until(removed, timeout=5, interval=0.1, what=f"{d} removed")


def _run(
    docker_client: Any,
    image: str,
    tmp_path: Path,
    *,
    cgroups: bool = True,
    user: int | None = None,
    init: bool = False,
) -> Any:
    """The daemon container with the documented flags: read-only rootfs, only six
    capabilities (none with ``user``), no-new-privileges, no network, its socket / state /
    logs in host dirs."""
    run_dir, state, logs = (tmp_path / n for n in ("run", "state", "logs"))
    for d in (run_dir, state, logs):
        d.mkdir()
        if user is not None:
            os.chown(d, user, user)
    name = f"sandboxd-ctr-{uuid.uuid4().hex[:10]}"
    extra, cg_dirs = _cgroup_flags(docker_client, name) if cgroups else ({}, [])
    if user is not None:
        extra["user"] = f"{user}:{user}"
    # the container's root daemon hands out host uids: it claims its range in the host's
    # claim directory (docs/operations.md, "Sandbox uid ranges"), a free one
    uidclaim.LOCK_DIR.mkdir(mode=0o755, exist_ok=True)
    uids = uid_range_env()
    extra["environment"] = {**extra.get("environment", {}), **uids}
    volumes = {
        str(run_dir): {"bind": "/run/sandboxd", "mode": "rw"},
        str(state): {"bind": "/var/lib/sandboxd", "mode": "rw"},
        str(logs): {"bind": "/var/log/sandboxd", "mode": "rw"},
        str(uidclaim.LOCK_DIR): {"bind": str(uidclaim.LOCK_DIR), "mode": "rw"},
        **extra.pop("volumes", {}),
    }
    try:
        c = docker_client.containers.run(
            image,
            detach=True,
            name=name,
            labels={TEST_LABEL: "1"},
            read_only=True,
            tmpfs={"/tmp": "rw,nosuid,nodev,size=64m"},
            cap_drop=["ALL"],
            cap_add=DAEMON_CAPS if user is None else [],
            security_opt=["no-new-privileges"],
            init=init,
            network_mode="none",
            mem_limit="1g",
            pids_limit=256,
            volumes=volumes,
            # The image's own HEALTHCHECK command, polled faster for the test (not every
            # second: each check is a Python process, seconds of CPU under emulation).
            healthcheck={
                "interval": 3_000_000_000,
                "start_period": 60_000_000_000,
                "timeout": 15_000_000_000,
                "retries": 3,
            },
            **extra,
        )
    except Exception:
        _remove_cgroups(name, cg_dirs)
        raise
    c.run_dir, c.state_dir, c.log_dir, c.cgroup_dirs = run_dir, state, logs, cg_dirs
    c.uids = uids
    return c


@pytest.fixture
def container(docker_client: Any, daemon_image: str, tmp_path: Path) -> Iterator[Any]:
    c = _run(docker_client, daemon_image, tmp_path)
    try:
        yield c
    finally:
        c.remove(force=True)
        _remove_cgroups(c.name, c.cgroup_dirs)


#: how long the daemon in its container may take to start serving or to refuse: its whole
#: start-up and self-test either way (under emulation beside another lane, a refusal took
#: over 120 s in the VM job, 2026-11-29)
START_S = 300


def _wait_for_socket(c: Any, sock: Path, timeout: float = START_S) -> None:
    def fail() -> None:
        pytest.fail(
            f"daemon container did not listen ({c.status}):\n"
            f"{c.logs().decode(errors='replace')[-4000:]}"
        )

    def listening() -> bool:
        if sock.exists():
            return True
        c.reload()
        if c.status == "exited":
            fail()
        return False

    try:
        wait_until(listening, timeout=timeout, interval=0.2, what=f"the daemon's socket {sock}")
    except AssertionError:
        fail()


def test_the_documented_run_serves_holds_its_capabilities_gets_healthy_and_stops_cleanly(
    container: Any,
) -> None:
    """The documented `docker run` end to end, in one container (each start costs minutes
    under the VM job's emulation): it serves a `python` call over its unix socket, holds only
    its six capabilities with no-new-privileges and seccomp, claims its sandbox uids on the
    host, turns healthy by the image's own HEALTHCHECK, and SIGTERM stops it with status 0,
    its socket and cgroups gone."""
    sock = container.run_dir / "sandboxd.sock"
    _wait_for_socket(container, sock)
    # -- it serves a python call; the audit log lands in the mounted log directory
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
    assert (container.log_dir / "audit.jsonl").exists()
    # -- only its capabilities, no-new-privileges, seccomp; its uids claimed on the host
    container.reload()
    pid = container.attrs["State"]["Pid"]
    status = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    want = sum(1 << CAP_BITS[c] for c in DAEMON_CAPS)
    assert int(status["CapEff"], 16) == want, status["CapEff"]
    # its sandbox uids are host uids: it claimed them on the host (pid as the host sees it)
    first, count = (int(v) for v in container.uids.values())
    assert uidclaim.holder(first, count) == uidclaim.Holder(pid, first, count)
    assert int(status["CapBnd"], 16) == want, status["CapBnd"]
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"

    # -- healthy, by the image's own HEALTHCHECK command
    def verdict() -> str:
        container.reload()
        health = container.attrs["State"].get("Health", {}).get("Status", "")
        return health if health in ("healthy", "unhealthy") else ""

    health = wait_until(verdict, timeout=120, interval=1, what="the health check's verdict",
                        detail=lambda: container.attrs["State"].get("Health"))
    assert health == "healthy", container.attrs["State"].get("Health")
    # -- SIGTERM (STOPSIGNAL), then SIGKILL after 60 s: it stops by itself, status 0
    container.stop(timeout=60)
    container.reload()
    assert container.attrs["State"]["ExitCode"] == 0, container.logs().decode()[-3000:]
    assert not sock.exists(), "socket left behind"
    left = [
        str(p)
        for d in container.cgroup_dirs
        if d != CGROUP
        for p in d.rglob("sandboxd-*")
        if p.is_dir() and p.name != "sandboxd-daemon"  # the leaf goes with the container's cgroup
    ]
    assert not left, f"the daemon left its cgroups behind: {left}"


def test_refuses_to_start_without_a_cgroup_subtree(
    docker_client: Any, daemon_image: str, tmp_path: Path
) -> None:
    """Documented: without a writable cgroup subtree the self-test fails and serve refuses."""
    c = _run(docker_client, daemon_image, tmp_path, cgroups=False)
    try:
        result = c.wait(timeout=START_S)
        logs = c.logs().decode(errors="replace")
        assert result["StatusCode"] != 0, logs
        assert "refusing to serve" in logs and "cgroup" in logs, logs[-2000:]
    finally:
        c.remove(force=True)


def test_under_an_init_process(docker_client: Any, daemon_image: str, tmp_path: Path) -> None:
    """`docker run --init`: tini is PID 1 and the daemon its child, in one cgroup. On cgroup v2
    the daemon takes its container's cgroup over (tini moves into the leaf with it) instead of
    building a cgroup of its own beside the container in the engine's (systemd's) tree."""
    c = _run(docker_client, daemon_image, tmp_path, init=True)
    try:
        sock = c.run_dir / "sandboxd.sock"
        _wait_for_socket(c, sock)
        transport = httpx.HTTPTransport(uds=str(sock))
        with httpx.Client(base_url="http://sandboxd", transport=transport, timeout=120) as client:
            response = client.post(
                "/v1/tools/python/invoke", json={"arguments": {"code": "print(6 * 7)"}}
            )
        assert response.status_code == 200, response.text
        result = response.json()
        assert result["status"] == "ok" and result["stdout"] == "42\n", result
        assert result["cleanup"]["verified"] is True
        c.reload()
        init_pid = c.attrs["State"]["Pid"]
        assert Path(f"/proc/{init_pid}/comm").read_text().strip().startswith("docker-init"), (
            "not run under docker's init"
        )
        logs = c.logs().decode(errors="replace")
        if (CGROUP / "cgroup.controllers").exists():
            assert "a container's own cgroup" in logs, logs[-3000:]
            own = Path(f"/proc/{init_pid}/cgroup").read_text().strip().removeprefix("0::")
            assert own.endswith("/sandboxd-daemon"), own
            container_cgroup = (CGROUP / own.lstrip("/")).parent
            beside = [p.name for p in container_cgroup.parent.iterdir() if p.is_dir()]
            assert beside == [container_cgroup.name], f"cgroups beside the container's: {beside}"
        else:
            assert "cgroup v1" in logs, logs[-3000:]
    finally:
        c.remove(force=True)
        _remove_cgroups(c.name, c.cgroup_dirs)


def _landlock() -> bool:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)) >= 1


def test_non_root_variant(docker_client: Any, daemon_image: str, tmp_path: Path) -> None:
    """Documented alternative: `--user 10000:10000 --cap-drop ALL` and no cgroup mounts. The
    workers keep uid 10000 and Landlock is their filesystem boundary: with Landlock the daemon
    serves; without it the self-test fails and it refuses to start."""
    c = _run(docker_client, daemon_image, tmp_path, cgroups=False, user=10000)
    try:
        if not _landlock():
            result = c.wait(timeout=START_S)
            logs = c.logs().decode(errors="replace")
            assert result["StatusCode"] != 0 and "write_outside_blocked" in logs, logs[-2000:]
            return
        sock = c.run_dir / "sandboxd.sock"
        _wait_for_socket(c, sock)
        transport = httpx.HTTPTransport(uds=str(sock))
        with httpx.Client(base_url="http://sandboxd", transport=transport, timeout=120) as cl:
            ready = cl.get("/readyz")
            assert ready.status_code == 200, ready.text
            checks = {ch["name"]: ch for ch in ready.json()["backends"]["restricted"]["checks"]}
            assert "enforced" in checks["landlock"]["detail"], checks
            r = cl.post("/v1/tools/python/invoke", json={"arguments": {"code": "2 ** 10"}})
        assert r.status_code == 200 and r.json()["value"] == 1024, r.text
        c.reload()
        pid = c.attrs["State"]["Pid"]
        status = Path(f"/proc/{pid}/status").read_text()
        assert "\nCapEff:\t0000000000000000" in status and "\nUid:\t10000\t" in status
    finally:
        c.remove(force=True)
