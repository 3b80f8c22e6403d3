"""Session containers that outlive a daemon restart (issue 26).

At a clean stop that keeps sessions (``sessions_survive_restart``), each live session
container whose runner directory is in the state directory (``<state>/run/<token>``: the next
daemon must reach it) is *kept*: the daemon writes a record
``<state>/kept-containers/<name>.json`` (0600: a fresh one-time key, the container's id, image
id, session, client, uid, workspace and kernel calls), asks its runner to ``suspend`` with
that key, and hangs up without removing the container. The runner keeps its kernel and
reconnects to the socket path of its (read-only) runner directory with that key. A runner
that does not answer the ``suspend`` request (an image built before it) is not kept: its
container is removed as at any stop, and the session's next python call says its kernel was
lost (``daemon_restart``).

The next start re-adopts a record only when everything checks out: its session was recovered
(same client, workspace and uid), and the engine shows the container running, labelled as this
daemon instance's container of that session, with the same name, image id, user and exactly
the workspace and runner directory bind-mounted. Then the daemon listens on the runner
directory again and waits for the runner's hello with the key. Whatever does not check out is
removed (by the start-up sweep of the instance's containers) and reported, so that the service
ends its session; but a container that merely stopped (:data:`NOT_RUNNING`), or whose image
an upgrade rebuilt (:data:`IMAGE_REBUILT`), leaves its session be, with its kernel lost.
Records are consumed by the start that reads them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sandboxd.backends.container import engine
from sandboxd.backends.container.boxes import Box, Boxes
from sandboxd.backends.container.dockerapi import Engine, EngineError, NotFound
from sandboxd.backends.container.idle import ThawFailed
from sandboxd.backends.container.runner import KEY_BYTES, Endpoint, RunnerLost
from sandboxd.backends.container.sessions import SessionContainers
from sandboxd.deadline import within

log = logging.getLogger("sandboxd.container")

KEPT_DIR = "kept-containers"
#: a kept container that stopped by itself (its runner gave up waiting, the engine or the host
#: restarted): removed, but its session stays (its kernel is reported lost); every other
#: failed check ends the session
NOT_RUNNING = "its container is not running"
#: its image's tag names another image now (an upgrade rebuilt it): the runner in the kept
#: container may speak another protocol than this daemon, so the container goes, and the
#: session stays, its kernel lost, as with :data:`NOT_RUNNING`
IMAGE_REBUILT = "its image was rebuilt since the stop (its runner may speak another protocol)"
KEEPS_SESSION = (NOT_RUNNING, IMAGE_REBUILT)
RESUME_TIMEOUT_S = 15.0  # the runner polls its socket path every 50 ms


@dataclass
class Kept:
    """What a stopping daemon writes down about one kept session container."""

    name: str
    cid: str
    image: str
    image_id: str
    session: str
    client: str
    uid: int | None
    workspace: str
    token: str  # its runner directory's name below <state>/run
    key: str  # hex: the runner's one-time key
    kernel_calls: int
    shape: dict[str, int]
    wheelhouse: bool | None = None  # None: a record of a daemon that did not write it


#: what the service hands the backend about a recovered session: (client, workspace, uid)
Expected = dict[str, tuple[str, str, int | None]]


def kept_dir(state_dir: Path) -> Path:
    return state_dir / KEPT_DIR


def load(state_dir: Path) -> list[Kept]:
    """Every record a stopping daemon left (malformed ones are dropped)."""
    found = []
    directory = kept_dir(state_dir)
    if not directory.is_dir():
        return []
    for path in sorted(directory.glob("*.json")):
        try:
            found.append(Kept(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError) as exc:
            log.warning("kept container record %s dropped: %s", path.name, exc)
    return found


def forget_all(state_dir: Path) -> None:
    """Consume the records (after an adoption round)."""
    directory = kept_dir(state_dir)
    if directory.is_dir():
        for path in directory.iterdir():
            with contextlib.suppress(OSError):
                path.unlink()


def _write(state_dir: Path, kept: Kept) -> None:
    directory = kept_dir(state_dir)
    directory.mkdir(mode=0o700, exist_ok=True)
    target = directory / f"{kept.name}.json"
    tmp = target.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(asdict(kept), fh)
    os.replace(tmp, target)


async def keep(boxes: Boxes, sessions: SessionContainers, keep_ids: set[str]) -> set[str]:
    """At a clean stop: keep the live session containers of the sessions ``keep_ids`` (see
    the module docstring). Returns the container ids kept (the caller's close must spare
    them and their runner directories)."""
    kept: set[str] = set()
    rundir = boxes.rundir
    state = boxes.config.state_dir
    if rundir is None or not rundir.is_relative_to(state) or boxes.engine_client is None:
        return kept  # a runner directory in /tmp would be gone for the next daemon
    for key, box in list(sessions.by_key.items()):
        channel = box.endpoint.channel
        if (key[1] not in keep_ids or box.dead or box.cid is None or channel is None
                or not box.endpoint.ready):
            continue
        try:
            with sessions.idle.using(key):  # a paused container cannot answer: thaw it first
                await sessions.idle.thaw(key, box)
            info = await boxes.engine(boxes.engine_client.inspect_container, box.cid)
            secret = secrets.token_bytes(KEY_BYTES)
            record = Kept(box.name, box.cid, box.image, str(info.get("Image") or ""), key[1],
                          key[0], box.uid, _workspace_of(info), box.endpoint.rundir.name,
                          secret.hex(), box.kernel_calls,
                          {"memory": box.shape.memory, "nano_cpus": box.shape.nano_cpus,
                           "pids": box.shape.pids}, box.wheelhouse)
            _write(state, record)
            if not await channel.suspend(secret):
                raise RunnerLost(f"its runner (image {box.image}) cannot wait for the next "
                                 "daemon: rebuild the image (sandboxd images build)")
        except (OSError, RunnerLost, ThawFailed, EngineError,
                ValueError) as exc:
            log.warning("session container %s not kept: %s", box.name, exc)
            with contextlib.suppress(OSError):
                (kept_dir(state) / f"{box.name}.json").unlink()
            continue
        del sessions.by_key[key]
        boxes.live.discard(box)
        await box.endpoint.close(keep_dir=True)
        kept.add(box.cid)
    return kept


def _workspace_of(info: dict[str, Any]) -> str:
    for mount in info.get("Mounts") or []:
        if mount.get("Destination") == "/workspace":
            return str(mount.get("Source") or "")
    return ""


def check(client: Engine, instance: str, rundir: Path, kept: Kept,
          expected: Expected) -> str | None:
    """Why the kept container may not be re-adopted (None: it checks out). Blocks."""
    want = expected.get(kept.session)
    if want is None:
        return "its session was not recovered"
    client_name, workspace, uid = want
    if (kept.client, kept.workspace, kept.uid) != (client_name, workspace, uid):
        return "its record does not match its session"
    try:
        info = client.inspect_container(kept.cid)
    except NotFound:
        return "its container is gone"
    state = info.get("State") or {}
    config = info.get("Config") or {}
    labels = config.get("Labels") or {}
    mounts = {m.get("Destination"): m.get("Source") for m in info.get("Mounts") or []}
    own_dir = rundir / kept.token
    if not state.get("Running"):
        return NOT_RUNNING
    if (labels.get(engine.LABEL_DAEMON) != instance
            or labels.get(engine.LABEL_SESSION) != kept.session
            or labels.get(engine.LABEL_ROLE) != "session"
            or info.get("Name") != f"/{kept.name}"):
        return "its container is not this daemon's container of the session"
    if info.get("Image") != kept.image_id or config.get("Image") != kept.image:
        return "its container runs another image"
    try:
        current = client.inspect_image(kept.image).get("Id")
    except NotFound:
        current = None
    if current != kept.image_id:
        return IMAGE_REBUILT
    if uid is not None and config.get("User") != f"{uid}:{uid}":
        return "its container runs as another user"
    if mounts.get("/workspace") != workspace or mounts.get(engine.RUNNER_MOUNT) != str(own_dir):
        return "its container has other mounts"
    try:
        st = os.lstat(own_dir)
    except OSError:
        return "its runner directory is gone"
    if not stat.S_ISDIR(st.st_mode):
        return "its runner directory is not a directory"
    return None


async def adopt(boxes: Boxes, sessions: SessionContainers, records: list[Kept],
                expected: Expected) -> dict[str, str]:
    """Re-adopt the kept containers that check out (see the module docstring); returns the
    sessions whose kept container did not, with why (their containers are left to the
    start-up sweep, which removes every container of the instance that is not live)."""
    failed: dict[str, str] = {}
    rundir = boxes.rundir
    for kept in records:
        why = ("the container backend has no runner directory" if rundir is None else
               await boxes.engine(check, boxes.client, boxes.config.instance_name, rundir,
                                  kept, expected))
        if why is None and rundir is not None:
            why = await _reconnect(boxes, sessions, rundir, kept)
        if why is not None:
            log.warning("session %s: its kept container %s is not adopted: %s",
                        kept.session, kept.name, why)
            if why not in KEEPS_SESSION:
                failed[kept.session] = why
    return failed


async def _reconnect(boxes: Boxes, sessions: SessionContainers, rundir: Path,
                     kept: Kept) -> str | None:
    owner = (kept.uid, kept.uid) if kept.uid is not None else None
    try:
        endpoint = await Endpoint.resume(rundir / kept.token, bytes.fromhex(kept.key), owner)
    except (OSError, ValueError) as exc:
        return f"its runner directory cannot be listened on ({exc})"
    done, _ = await within(endpoint.settled.wait(), RESUME_TIMEOUT_S)
    if not done or not endpoint.ready:
        await endpoint.close()
        return f"its runner did not come back ({endpoint.failure or 'no answer'})"
    shape = engine.Shape(**kept.shape)
    box = Box(name=kept.name, image=kept.image, shape=shape, endpoint=endpoint, role="session",
              cid=kept.cid, uid=kept.uid, kernel_calls=kept.kernel_calls,
              wheelhouse=kept.wheelhouse)
    boxes.live.add(box)
    sessions.by_key[(kept.client, kept.session, kept.image)] = box
    return None
