"""Docker engine access for the container backend: the container spec, create/start, destroy
with verification, and the start-up sweep. All functions here block (an engine request,
:mod:`.dockerapi`); the backend calls them in worker threads.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxd.backends.container.config import ContainerConfig
from sandboxd.backends.container.dockerapi import APIError, Engine, NoAnswer, NotFound
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


def connect(config: ContainerConfig, timeout: float = 60) -> Engine:
    """An engine client that keeps enough connections for concurrent calls (it connects on
    its first request)."""
    return Engine(config.docker_url, timeout=timeout, keep=32)


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

    def host_fields(self) -> dict[str, int]:
        """The engine's host-config fields of this shape (at create and at update)."""
        return {"Memory": self.memory, "MemorySwap": self.memory,
                "NanoCpus": self.nano_cpus, "PidsLimit": self.pids}


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
    wheelhouse: bool = False  # the admin's wheelhouse is mounted (see :func:`mounts_wheelhouse`)


def mounts_wheelhouse(config: ContainerConfig, role: str) -> bool:
    """Whether a container made now for ``role`` gets the wheelhouse: a session's, when the
    ``wheelhouse`` setting names a directory that exists now. A container keeps what it got:
    its session's ``install_packages`` says so when the wheelhouse came later."""
    return role == "session" and config.wheelhouse is not None and config.wheelhouse.is_dir()


def container_body(config: ContainerConfig, seccomp: str, spec: Spec) -> dict[str, Any]:
    """The engine's create request for ``spec``: the container's config and its host config
    (every confinement the container gets is here)."""
    uid, gid = ((spec.uid, spec.uid) if spec.uid is not None
                else (config.sandbox_uid, config.sandbox_gid))
    if uid == 0 or gid == 0:
        raise ValueError("sandbox containers never run as root")
    quota = int(config.session_quota_bytes)
    tmpfs = {"/tmp": f"rw,noexec,nosuid,nodev,size={TMP_BYTES},mode=1777"}
    binds = [f"{spec.rundir}:{RUNNER_MOUNT}:ro"]
    if spec.workspace is None:
        # the same limits as the daemon's own tmpfs workspaces (sandboxd.workspaces.quota): bytes,
        # and
        # inodes (one more than the entry quota: the root directory uses one)
        inodes = int(config.session_quota_entries) + 1
        tmpfs["/workspace"] = (f"rw,nosuid,nodev,size={quota},nr_inodes={inodes},"
                               f"uid={uid},gid={gid},mode=0700")
    host: dict[str, Any] = {
        "Binds": binds,
        # a mount (not a bind): the engine refuses a missing workspace (a session that
        # ended) instead of making an empty one as root
        "Mounts": [] if spec.workspace is None else [
            {"Target": "/workspace", "Source": str(spec.workspace), "Type": "bind",
             "ReadOnly": False}],
        "Tmpfs": tmpfs,
        "ReadonlyRootfs": True,
        "CapDrop": ["ALL"],
        "SecurityOpt": ["no-new-privileges:true", f"seccomp={seccomp}"],
        "NetworkMode": spec.network or "none",
        **spec.shape.host_fields(),
        "Ulimits": [
            {"Name": "nofile", "Soft": NOFILE, "Hard": NOFILE},
            {"Name": "fsize", "Soft": quota, "Hard": quota},
            {"Name": "core", "Soft": 0, "Hard": 0},
        ],
        "Init": True,
        "IpcMode": "private",
    }
    if spec.wheelhouse and config.wheelhouse is not None:
        # the admin's wheels, for install_packages: read-only; a mount (not a bind) so that
        # the engine refuses a missing directory instead of creating it
        host["Mounts"].append({"Target": WHEELHOUSE_MOUNT, "Source": str(config.wheelhouse),
                               "Type": "bind", "ReadOnly": True})
    labels = {
        LABEL_DAEMON: config.instance_name,
        LABEL_INVOCATION: spec.invocation,
        LABEL_ROLE: spec.role,
    }
    if spec.session:
        labels[LABEL_SESSION] = spec.session
    return {
        "Image": spec.image,
        "User": f"{uid}:{gid}",
        "WorkingDir": "/workspace",
        "Env": [],
        "Labels": labels,
        "Hostname": "sandbox",
        "NetworkDisabled": spec.network is None,
        "OpenStdin": False,
        "StdinOnce": False,
        "AttachStdin": False,
        "AttachStdout": True,
        "AttachStderr": True,
        "Tty": False,
        "HostConfig": host,
    }


def create_and_start(client: Engine, config: ContainerConfig, seccomp: str,
                     spec: Spec) -> str:
    """Create and start a container for ``spec``; returns its id. On failure nothing is left."""
    cid = client.create(container_body(config, seccomp, spec), spec.name)
    try:
        client.start(cid)
    except BaseException:
        destroy(client, cid)
        raise
    return cid


def update_shape(client: Engine, cid: str, shape: Shape) -> None:
    """Change a running container's memory, CPU and pids limits (one engine round trip)."""
    client.update(cid, shape.host_fields())


def destroy(client: Engine, cid: str, *, wait_s: float = 30.0) -> bool:
    """Kill and remove a container; True only once the engine answers 404 for it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            client.remove(cid)
        except NotFound:
            pass
        except APIError as exc:  # e.g. 409 "removal already in progress"
            log.debug("remove %s: %s", cid[:12], exc)
        try:
            client.inspect_container(cid)
        except NotFound:
            return True
        except NoAnswer:
            raise  # the engine is gone: no use retrying (its watch takes over)
        except Exception as exc:  # engine hiccup: retry until the deadline
            log.debug("inspect %s: %s", cid[:12], exc)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def pause(client: Engine, cid: str) -> None:
    """Freeze every process of a container (the engine's pause: the cgroup freezer). An
    engine refusal is an error unless the container is paused after all."""
    try:
        client.pause(cid)
    except APIError:
        if not _state(client, cid).get("Paused"):
            raise


def unpause(client: Engine, cid: str) -> None:
    """Thaw a paused container. An engine refusal is an error unless the container runs,
    unpaused, after all (e.g. it was never paused: a pause whose outcome was unknown)."""
    try:
        client.unpause(cid)
    except APIError:
        state = _state(client, cid)
        if not state.get("Running") or state.get("Paused"):
            raise


def _state(client: Engine, cid: str) -> dict[str, Any]:
    try:
        state: dict[str, Any] = client.inspect_container(cid).get("State") or {}
    except Exception:
        return {}
    return state


def init_pid(client: Engine, cid: str) -> int:
    """The pid of the container's init, in the engine's PID namespace (0: none)."""
    return int(_state(client, cid).get("Pid") or 0)


def is_running(client: Engine, cid: str) -> bool:
    """Whether the container exists and is running."""
    try:
        state: dict[str, Any] = client.inspect_container(cid).get("State") or {}
    except NotFound:
        return False
    return bool(state.get("Running"))


def oom_killed(client: Engine, cid: str, *, runner_lost: bool = False) -> bool:
    """Whether the engine saw an OOM kill in the container (``State.OOMKilled``).

    ``runner_lost``: the runner vanished, so the container is stopping; the answer waits (at
    most ``OOM_SETTLE_S``) until the engine has seen it stop. Asked at once, the engine may not
    have handled the kernel's OOM event yet: the kernel can kill the runner in a second OOM
    kill right after the call's process, and its socket closes before the engine hears."""
    deadline = time.monotonic() + (OOM_SETTLE_S if runner_lost else 0.0)
    stopped_at: float | None = None
    while True:
        try:
            state: dict[str, Any] = client.inspect_container(cid).get("State") or {}
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


def ours(client: Engine, instance: str) -> list[str]:
    """Ids of every container (running or not) labelled as this daemon instance's."""
    return client.container_ids(f"{LABEL_DAEMON}={instance}")


def sweep(client: Engine, instance: str,
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


def image_problem(client: Engine, image: str) -> str | None:
    """None when ``image`` is present locally, else a one-line explanation."""
    try:
        client.inspect_image(image)
    except NotFound:
        return f"the sandbox image {image} is missing: run `sandboxd images build`"
    except Exception as exc:
        return f"cannot inspect the sandbox image {image}: {exc}"
    return None
