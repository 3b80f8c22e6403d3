"""Docker engine access for the container backend: the container spec, create/start, destroy
with verification, and the start-up sweep. All functions here block (docker SDK); the backend
calls them in worker threads.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import requests
from docker.errors import APIError, NotFound
from docker.types import Mount, Ulimit

from sandboxd.backends.container.config import ContainerConfig
from sandboxd.models import Limits
from sandboxd.protocol.packages import WHEELHOUSE_MOUNT

log = logging.getLogger("sandboxd.container")

LABEL_DAEMON = "sandboxd.daemon"
LABEL_INVOCATION = "sandboxd.invocation"
LABEL_ROLE = "sandboxd.role"
LABEL_SESSION = "sandboxd.session"
RUNNER_MOUNT = "/run/sandboxd"
RUNNER_LABEL = "sandboxd.runner.sha256"
#: processes the sandbox machinery itself needs (init, runner, a handler per concurrent call)
PIDS_OVERHEAD = 6
TMP_BYTES = 64 * 1024 * 1024
NOFILE = 1024
CHILD_PATH = "/usr/local/bin:/usr/bin:/bin"
OOM_SETTLE_S = 5.0  # how long a container whose runner vanished gets to be seen stopped
OOM_EVENT_GRACE_S = 1.0  # and, once stopped, to be marked OOM-killed (see oom_killed)


def shipped_seccomp_profile() -> Path:
    """The seccomp profile shipped in ``policies/`` (source tree or installed package data)."""
    here = Path(__file__).resolve()
    candidates = [
        here.parents[3] / "policies" / "seccomp.json",  # source checkout
        here.parents[2] / "_data" / "policies" / "seccomp.json",  # wheel (force-include)
    ]
    for path in candidates:
        if path.is_file():
            return path
    return candidates[0]


def load_seccomp(config: ContainerConfig) -> str:
    """The seccomp profile as compact JSON text (what ``security_opt=seccomp=`` wants)."""
    path = config.seccomp_profile or shipped_seccomp_profile()
    return json.dumps(json.loads(path.read_text()), separators=(",", ":"))


def connect(config: ContainerConfig, timeout: float = 60) -> docker.DockerClient:
    """A docker client with a connection pool big enough for concurrent calls."""
    if config.docker_url:
        return docker.DockerClient(base_url=config.docker_url, timeout=timeout,
                                   max_pool_size=32)
    return docker.from_env(timeout=timeout, max_pool_size=32)


@dataclass(frozen=True)
class Shape:
    """The resource part of a container's config: what a call's limits change."""

    memory: int
    nano_cpus: int
    pids: int

    @classmethod
    def of(cls, limits: Limits) -> Shape:
        return cls(
            memory=int(limits.memory_bytes),
            nano_cpus=max(int(limits.cpus * 1e9), 10_000_000),
            pids=int(limits.pids) + PIDS_OVERHEAD,
        )


@dataclass(frozen=True)
class Spec:
    """Everything needed to create one sandbox container."""

    name: str
    image: str
    shape: Shape
    rundir: Path
    role: str  # "pool" | "session" | "oneshot" | "probe"
    invocation: str
    workspace: Path | None  # None: a size-capped tmpfs at /workspace (pool containers)
    network: str | None = None
    session: str | None = None
    uid: int | None = None  # the sandbox's own uid (= gid); None: config.sandbox_uid


def create_and_start(client: docker.DockerClient, config: ContainerConfig, seccomp: str,
                     spec: Spec) -> str:
    """Create and start a container for ``spec``; returns its id. On failure nothing is left."""
    api = client.api
    uid, gid = ((spec.uid, spec.uid) if spec.uid is not None
                else (config.sandbox_uid, config.sandbox_gid))
    if uid == 0 or gid == 0:
        raise ValueError("sandbox containers never run as root")
    quota = int(config.session_quota_bytes)
    tmpfs = {"/tmp": f"rw,noexec,nosuid,nodev,size={TMP_BYTES},mode=1777"}
    binds = {str(spec.rundir): {"bind": RUNNER_MOUNT, "mode": "ro"}}
    if spec.workspace is None:
        # the same limits as the daemon's own tmpfs workspaces (sandboxd.quotafs): bytes, and
        # inodes (one more than the entry quota: the root directory uses one)
        inodes = int(config.session_quota_entries) + 1
        tmpfs["/workspace"] = (f"rw,nosuid,nodev,size={quota},nr_inodes={inodes},"
                               f"uid={uid},gid={gid},mode=0700")
    else:
        binds[str(spec.workspace)] = {"bind": "/workspace", "mode": "rw"}
    mounts = []
    if spec.role == "session" and config.wheelhouse is not None and config.wheelhouse.is_dir():
        # the admin's wheels, for install_packages: read-only; a Mount (not a bind) so that
        # the engine refuses a missing directory instead of creating it
        mounts.append(Mount(WHEELHOUSE_MOUNT, str(config.wheelhouse), type="bind",
                            read_only=True))
    host_config = api.create_host_config(
        binds=binds,
        mounts=mounts,
        tmpfs=tmpfs,
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges:true", f"seccomp={seccomp}"],
        network_mode=spec.network or "none",
        mem_limit=spec.shape.memory,
        memswap_limit=spec.shape.memory,
        nano_cpus=spec.shape.nano_cpus,
        pids_limit=spec.shape.pids,
        ulimits=[
            Ulimit(name="nofile", soft=NOFILE, hard=NOFILE),
            Ulimit(name="fsize", soft=quota, hard=quota),
            Ulimit(name="core", soft=0, hard=0),
        ],
        init=True,
        ipc_mode="private",
        auto_remove=False,
    )
    labels = {
        LABEL_DAEMON: config.instance_name,
        LABEL_INVOCATION: spec.invocation,
        LABEL_ROLE: spec.role,
    }
    if spec.session:
        labels[LABEL_SESSION] = spec.session
    created = api.create_container(
        spec.image,
        name=spec.name,
        user=f"{uid}:{gid}",
        working_dir="/workspace",
        environment=[],
        labels=labels,
        host_config=host_config,
        hostname="sandbox",
        network_disabled=spec.network is None,
        stdin_open=False,
        tty=False,
    )
    cid: str = created["Id"]
    try:
        api.start(cid)
    except BaseException:
        destroy(client, cid)
        raise
    return cid


def update_shape(client: docker.DockerClient, cid: str, shape: Shape) -> None:
    """Change a running container's memory, CPU and pids limits (one engine round trip)."""
    api = client.api
    url = api._url("/containers/{0}/update", cid)
    body = {"Memory": shape.memory, "MemorySwap": shape.memory,
            "NanoCpus": shape.nano_cpus, "PidsLimit": shape.pids}
    res = api._post_json(url, data=body)
    api._raise_for_status(res)


def destroy(client: docker.DockerClient, cid: str, *, wait_s: float = 30.0) -> bool:
    """Kill and remove a container; True only once the engine answers 404 for it."""
    api = client.api
    deadline = time.monotonic() + wait_s
    while True:
        try:
            api.remove_container(cid, force=True, v=True)
        except NotFound:
            pass
        except APIError as exc:  # e.g. 409 "removal already in progress"
            log.debug("remove %s: %s", cid[:12], exc)
        try:
            api.inspect_container(cid)
        except NotFound:
            return True
        except requests.exceptions.ConnectionError:
            raise  # the engine is gone: no use retrying (its watch takes over)
        except Exception as exc:  # engine hiccup: retry until the deadline
            log.debug("inspect %s: %s", cid[:12], exc)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def pause(client: docker.DockerClient, cid: str) -> None:
    """Freeze every process of a container (the engine's pause: the cgroup freezer). An
    engine refusal is an error unless the container is paused after all."""
    try:
        client.api.pause(cid)
    except APIError:
        if not _state(client, cid).get("Paused"):
            raise


def unpause(client: docker.DockerClient, cid: str) -> None:
    """Thaw a paused container. An engine refusal is an error unless the container runs,
    unpaused, after all (e.g. it was never paused: a pause whose outcome was unknown)."""
    try:
        client.api.unpause(cid)
    except APIError:
        state = _state(client, cid)
        if not state.get("Running") or state.get("Paused"):
            raise


def _state(client: docker.DockerClient, cid: str) -> dict[str, Any]:
    try:
        state: dict[str, Any] = client.api.inspect_container(cid).get("State") or {}
    except Exception:
        return {}
    return state


def init_pid(client: docker.DockerClient, cid: str) -> int:
    """The pid of the container's init, in the engine's PID namespace (0: none)."""
    return int(_state(client, cid).get("Pid") or 0)


def is_running(client: docker.DockerClient, cid: str) -> bool:
    """Whether the container exists and is running."""
    try:
        state: dict[str, Any] = client.api.inspect_container(cid).get("State") or {}
    except NotFound:
        return False
    return bool(state.get("Running"))


def oom_killed(client: docker.DockerClient, cid: str, *, runner_lost: bool = False) -> bool:
    """Whether the engine saw an OOM kill in the container (``State.OOMKilled``).

    ``runner_lost``: the runner vanished, so the container is stopping; the answer waits (at
    most ``OOM_SETTLE_S``) until the engine has seen it stop. Asked at once, the engine may not
    have handled the kernel's OOM event yet: the kernel can kill the runner in a second OOM
    kill right after the call's process, and its socket closes before the engine hears."""
    deadline = time.monotonic() + (OOM_SETTLE_S if runner_lost else 0.0)
    stopped_at: float | None = None
    while True:
        try:
            state: dict[str, Any] = client.api.inspect_container(cid).get("State") or {}
        except Exception:
            return False
        if state.get("OOMKilled"):
            return True
        now = time.monotonic()
        if not state.get("Running") and stopped_at is None:
            stopped_at = now
        # the engine learns of an OOM kill from an event of its own, which may come after
        # the one that tells it the container stopped (seen under cgroup v2: a memory bomb
        # reported as "the sandbox runner went away"): a stopped container gets
        # OOM_EVENT_GRACE_S more to be marked
        if now >= deadline or (stopped_at is not None and now - stopped_at >= OOM_EVENT_GRACE_S):
            return False
        time.sleep(0.05)


def ours(client: docker.DockerClient, instance: str) -> list[str]:
    """Ids of every container (running or not) labelled as this daemon instance's."""
    found = client.api.containers(all=True, quiet=True,
                                  filters={"label": f"{LABEL_DAEMON}={instance}"})
    return [c["Id"] for c in found]


def sweep(client: docker.DockerClient, instance: str,
          keep: frozenset[str] = frozenset()) -> list[str]:
    """Remove every container of this instance (left by a crash or an engine outage) but
    those in ``keep`` (ids in use); returns their ids."""
    removed = []
    for cid in ours(client, instance):
        if any(cid.startswith(k) or k.startswith(cid) for k in keep):
            continue
        if destroy(client, cid):
            removed.append(cid)
    return removed


def image_problem(client: docker.DockerClient, image: str) -> str | None:
    """None when ``image`` is present locally, else a one-line explanation."""
    try:
        client.api.inspect_image(image)
    except NotFound:
        return f"the sandbox image {image} is missing: run `sandboxd images build`"
    except Exception as exc:
        return f"cannot inspect the sandbox image {image}: {exc}"
    return None
