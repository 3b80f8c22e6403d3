"""The engine request that creates a sandbox container (``engine.container_body``) is the one
the Docker SDK built before the daemon dropped it (for the memory and start time it cost): the same
container config and host config for every kind of container. The SDK stays installed for ``sandboxd
images``; here it is the reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from docker import APIClient
from docker.types import Mount, Ulimit

from sandboxd.backends.container import engine
from sandboxd.backends.container.config import ContainerConfig
from sandboxd.protocol.packages import WHEELHOUSE_MOUNT


def _sdk_body(config: ContainerConfig, seccomp: str, spec: engine.Spec) -> dict[str, Any]:
    """What ``create_and_start`` sent through the SDK (its code before the change)."""
    api = APIClient(version="1.41")  # a given version: the client never connects
    uid, gid = ((spec.uid, spec.uid) if spec.uid is not None
                else (config.sandbox_uid, config.sandbox_gid))
    quota = int(config.session_quota_bytes)
    tmpfs = {"/tmp": f"rw,noexec,nosuid,nodev,size={engine.TMP_BYTES},mode=1777"}
    binds = {str(spec.rundir): {"bind": engine.RUNNER_MOUNT, "mode": "ro"}}
    if spec.workspace is None:
        inodes = int(config.session_quota_entries) + 1
        tmpfs["/workspace"] = (f"rw,nosuid,nodev,size={quota},nr_inodes={inodes},"
                               f"uid={uid},gid={gid},mode=0700")
    mounts = []
    if spec.workspace is not None:  # a mount: the engine refuses a missing source
        mounts.append(Mount("/workspace", str(spec.workspace), type="bind", read_only=False))
    if spec.role == "session" and config.wheelhouse is not None and config.wheelhouse.is_dir():
        mounts.append(Mount(WHEELHOUSE_MOUNT, str(config.wheelhouse), type="bind",
                            read_only=True))
    host_config = api.create_host_config(
        binds=binds, mounts=mounts, tmpfs=tmpfs, read_only=True, cap_drop=["ALL"],
        security_opt=["no-new-privileges:true", f"seccomp={seccomp}"],
        network_mode=spec.network or "none", mem_limit=spec.shape.memory,
        memswap_limit=spec.shape.memory, nano_cpus=spec.shape.nano_cpus,
        pids_limit=spec.shape.pids,
        ulimits=[Ulimit(name="nofile", soft=engine.NOFILE, hard=engine.NOFILE),
                 Ulimit(name="fsize", soft=quota, hard=quota),
                 Ulimit(name="core", soft=0, hard=0)],
        init=True, ipc_mode="private", auto_remove=False)
    labels = {engine.LABEL_DAEMON: config.instance_name,
              engine.LABEL_INVOCATION: spec.invocation, engine.LABEL_ROLE: spec.role}
    if spec.session:
        labels[engine.LABEL_SESSION] = spec.session
    body: dict[str, Any] = api.create_container_config(
        spec.image, None, user=f"{uid}:{gid}", working_dir="/workspace", environment=[],
        labels=labels, host_config=host_config, hostname="sandbox",
        network_disabled=spec.network is None, stdin_open=False, tty=False)
    return body


def _without_nulls(value: Any) -> Any:
    """The engine reads a null field as an absent one."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


@pytest.mark.parametrize("kind", ["pool", "session", "oneshot-network", "probe-uid",
                                  "session-no-wheelhouse"])
def test_the_create_request_is_the_sdks(tmp_path: Path, kind: str) -> None:
    wheels = tmp_path / "wheels"
    if kind != "session-no-wheelhouse":
        wheels.mkdir()
    config = ContainerConfig(state_dir=tmp_path, instance_name="inst", python_image="py:1",
                             shell_image="sh:1", session_quota_bytes=123 << 20,
                             session_quota_entries=999, wheelhouse=wheels)
    shape = engine.Shape(memory=256 << 20, nano_cpus=1_500_000_000, pids=70)
    spec = engine.Spec(
        name=f"sandboxd-{kind}", image="py:1", shape=shape, rundir=tmp_path / "run" / "r1",
        role=kind.split("-")[0], invocation="inv-1",
        workspace=None if kind == "pool" else tmp_path / "ws",
        network="bridge" if kind.endswith("network") else None,
        session="s1" if kind.startswith("session") else None,
        uid=20123 if kind.endswith("uid") else None,
        wheelhouse=engine.mounts_wheelhouse(config, kind.split("-")[0]))
    ours = engine.container_body(config, '{"defaultAction":"SCMP_ACT_ERRNO"}', spec)
    sdk = _sdk_body(config, '{"defaultAction":"SCMP_ACT_ERRNO"}', spec)
    assert _without_nulls(ours) == _without_nulls(sdk)
    wheelhouse = [m for m in ours["HostConfig"]["Mounts"] if m["Source"] == str(wheels)]
    assert bool(wheelhouse) is (kind == "session")
    # the workspace is a mount, never a bind (which the engine would make when missing)
    workspace = [m for m in ours["HostConfig"]["Mounts"] if m["Target"] == "/workspace"]
    assert len(workspace) == (kind != "pool")
    assert not any(b.endswith(":/workspace:rw") for b in ours["HostConfig"]["Binds"])


def test_never_root(tmp_path: Path) -> None:
    config = ContainerConfig(state_dir=tmp_path, instance_name="i", python_image="p",
                             shell_image="s")
    spec = engine.Spec(name="n", image="p", shape=engine.Shape(1 << 20, 10**9, 10),
                       rundir=tmp_path, role="pool", invocation="i", workspace=None, uid=0)
    with pytest.raises(ValueError, match="never run as root"):
        engine.container_body(config, "{}", spec)
