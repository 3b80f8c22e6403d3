"""Session containers that outlive a daemon restart (an upgrade must not end users' work).

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
directory again and waits for the runner's hello with the key. A session's bash container is
kept and re-adopted as its python one is (its lane in the record): its runner keeps its bash
kernel, with its working directory, variables, functions and aliases. Whatever does not check
out is removed and reported, so that the service ends its session; but a container that merely
stopped (:data:`NOT_RUNNING`), whose image an upgrade rebuilt (:data:`IMAGE_REBUILT`) or
whose runner did not come back in time (:data:`NOT_BACK`) leaves its session be, with its
kernel lost.

Bounded whatever the sandboxes do: the stop suspends every runner at once, within what is
left of the stop's bound (``shutdown_timeout_s``); the start re-adopts every record at once,
in the background while the daemon serves, within ``adopt_timeout_s`` in all; each record
is consumed as it is tried, so a start killed meanwhile does not wait for it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sandboxd.backends.container import engine
from sandboxd.backends.container.boxes import Box, Boxes
from sandboxd.backends.container.dockerapi import Engine, EngineError, NotFound
from sandboxd.backends.container.runner import KEY_BYTES, Endpoint, RunnerLost
from sandboxd.backends.container.sessions import SessionContainers
from sandboxd.util.deadline import within
from sandboxd.workspaces import fstree

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
#: its runner did not reconnect within ``adopt_timeout_s`` (stopped by its own code, say): the
#: container goes, the session stays with its kernel lost (the runner polls every 50 ms)
NOT_BACK = "its runner did not come back"


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
    lane: str | None = None  # its session key's lane (image + language); None: the image


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


def _write(state_dir: Path, kept: Kept) -> None:
    directory = kept_dir(state_dir)
    directory.mkdir(mode=0o700, exist_ok=True)
    target = directory / f"{kept.name}.json"
    tmp = target.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(asdict(kept), fh)
    os.replace(tmp, target)


async def keep(boxes: Boxes, sessions: SessionContainers, keep_ids: set[str],
               kept: set[str]) -> None:
    """At a clean stop: keep the live session containers of the sessions ``keep_ids`` (see
    the module docstring), all at once; adds each container id to ``kept`` as soon as its
    runner said so (the caller's close must spare them and their runner directories, also
    when the stop's bound cuts this short)."""
    rundir = boxes.rundir
    state = boxes.config.state_dir
    if rundir is None or not rundir.is_relative_to(state) or boxes.engine_client is None:
        return  # a runner directory in /tmp would be gone for the next daemon
    chosen = [(key, box) for key, box in list(sessions.by_key.items())
              if key[1] in keep_ids and _reachable(box)]
    results = await asyncio.gather(*(_keep_one(boxes, sessions, key, box, kept)
                                     for key, box in chosen), return_exceptions=True)
    for result in results:
        if isinstance(result, asyncio.CancelledError):
            raise result


def _reachable(box: Box) -> bool:
    """A live container whose runner is connected: the one kind that can be kept."""
    return (not box.dead and box.cid is not None and box.endpoint.channel is not None
            and box.endpoint.ready)


async def _keep_one(boxes: Boxes, sessions: SessionContainers, key: tuple[str, str, str],
                    box: Box, kept: set[str]) -> None:
    state = boxes.config.state_dir
    channel = box.endpoint.channel
    assert channel is not None and box.cid is not None and boxes.engine_client is not None
    try:
        with sessions.idle.using(key):  # a paused container cannot answer: thaw it first
            await sessions.idle.thaw(key, box)
        info = await boxes.engine(boxes.engine_client.inspect_container, box.cid)
        secret = secrets.token_bytes(KEY_BYTES)
        record = Kept(box.name, box.cid, box.image, str(info.get("Image") or ""), key[1],
                      key[0], box.uid, str(_mounts(info).get("/workspace") or ""),
                      box.endpoint.rundir.name,
                      secret.hex(), box.kernel_calls,
                      {"memory": box.shape.memory, "nano_cpus": box.shape.nano_cpus,
                       "pids": box.shape.pids}, box.wheelhouse, key[2])
        _write(state, record)
        if not await channel.suspend(secret):
            raise RunnerLost(f"its runner (image {box.image}) did not say it waits for the "
                             "next daemon (stopped, busy, or an image older than that: "
                             "sandboxd images build)")
    except Exception as exc:
        log.warning("session container %s not kept: %s", box.name, exc)
        _forget(state, box.name)
        return
    except BaseException:
        _forget(state, box.name)
        raise
    kept.add(box.cid)
    if sessions.by_key.get(key) is box:
        del sessions.by_key[key]
    boxes.live.discard(box)
    await box.endpoint.close(keep_dir=True)


def _forget(state_dir: Path, name: str) -> None:
    """Remove the record of a container (not kept, or consumed as it is tried)."""
    with contextlib.suppress(OSError):
        (kept_dir(state_dir) / f"{name}.json").unlink()


def _config(info: dict[str, Any]) -> dict[str, Any]:
    """The ``Config`` section of a container's inspection (empty when it has none)."""
    return info.get("Config") or {}


def _mounts(info: dict[str, Any]) -> dict[str | None, str | None]:
    """A container's mounts by destination: where each is bound from."""
    return {m.get("Destination"): m.get("Source") for m in info.get("Mounts") or []}


def check(client: Engine, instance: str, rundir: Path, kept: Kept,
          expected: Expected) -> str | None:
    """Why the kept container may not be re-adopted (None: it checks out). Blocks."""
    why = _record_problem(kept, expected.get(kept.session))
    if why is not None:
        return why
    try:
        info = client.inspect_container(kept.cid)
    except NotFound:
        return "its container is gone"
    if not (info.get("State") or {}).get("Running"):
        return NOT_RUNNING
    return (_identity_problem(info, instance, kept)
            or _image_problem(client, info, kept)
            or _confinement_problem(info, rundir / kept.token, kept.workspace, kept.uid))


def _record_problem(kept: Kept, want: tuple[str, str, int | None] | None) -> str | None:
    """The record against its recovered session (``want``: its client, workspace and uid;
    None: it was not recovered)."""
    if want is None:
        return "its session was not recovered"
    if ((kept.client, kept.workspace, kept.uid) != want
            or (kept.lane is not None and kept.lane.split(" ")[0] != kept.image)):
        return "its record does not match its session"
    return None


def _identity_problem(info: dict[str, Any], instance: str, kept: Kept) -> str | None:
    labels = _config(info).get("Labels") or {}
    if (labels.get(engine.LABEL_DAEMON) != instance
            or labels.get(engine.LABEL_SESSION) != kept.session
            or labels.get(engine.LABEL_ROLE) != "session"
            or info.get("Name") != f"/{kept.name}"):
        return "its container is not this daemon's container of the session"
    return None


def _image_problem(client: Engine, info: dict[str, Any], kept: Kept) -> str | None:
    if info.get("Image") != kept.image_id or _config(info).get("Image") != kept.image:
        return "its container runs another image"
    try:
        current = client.inspect_image(kept.image).get("Id")
    except NotFound:
        current = None
    return IMAGE_REBUILT if current != kept.image_id else None


def _confinement_problem(info: dict[str, Any], own_dir: Path, workspace: str,
                         uid: int | None) -> str | None:
    """Its user, its mounts and its runner directory are the ones this daemon gave it."""
    if uid is not None and _config(info).get("User") != f"{uid}:{uid}":
        return "its container runs as another user"
    mounts = _mounts(info)
    if mounts.get("/workspace") != workspace or mounts.get(engine.RUNNER_MOUNT) != str(own_dir):
        return "its container has other mounts"
    return _rundir_problem(own_dir)


def _rundir_problem(own_dir: Path) -> str | None:
    """Its runner directory is still there, and a directory (not a link put in its place)."""
    try:
        st = os.lstat(own_dir)
    except OSError:
        return "its runner directory is gone"
    if not stat.S_ISDIR(st.st_mode):
        return "its runner directory is not a directory"
    return None


async def adopt(boxes: Boxes, sessions: SessionContainers, records: list[Kept],
                expected: Expected, deadline: float,
                settled: Callable[[str, str | None], None] = lambda session, why: None,
                ) -> dict[str, str]:
    """Re-adopt the kept containers that check out (see the module docstring), all at once and
    by ``deadline`` (monotonic) in all; returns the sessions whose kept container did not,
    with why. Each record is consumed as it is tried (a start killed meanwhile does not wait
    for it again); a container of this instance that is not adopted is removed here, with its
    runner directory. ``settled(session, why)`` is called as each record is settled."""
    results = await asyncio.gather(
        *(_adopt_one(boxes, sessions, kept, expected, deadline, settled) for kept in records),
        return_exceptions=True)
    failed: dict[str, str] = {}
    for kept, why in zip(records, results, strict=True):
        if isinstance(why, BaseException):  # (only a cancel: _adopt_one says why otherwise)
            raise why
        if why is not None and not keeps_session(why):
            failed[kept.session] = why
    return failed


def keeps_session(why: str) -> bool:
    """Whether a kept container that was not adopted for ``why`` leaves its session be (its
    kernel lost): it stopped, its image was rebuilt, or its runner did not come back in time
    (what its own code can do to it: SIGSTOP). Every other failed check ends the session."""
    return why in KEEPS_SESSION or why.startswith(NOT_BACK)


async def _adopt_one(boxes: Boxes, sessions: SessionContainers, kept: Kept,
                     expected: Expected, deadline: float,
                     settled: Callable[[str, str | None], None]) -> str | None:
    rundir = boxes.rundir
    _forget(boxes.config.state_dir, kept.name)  # consumed as it is tried
    why: str | None = "the container backend has no runner directory"
    try:
        if rundir is not None:
            why = await boxes.engine(check, boxes.client, boxes.config.instance_name, rundir,
                                     kept, expected)
            if why is None:
                why = await _reconnect(boxes, sessions, rundir, kept, deadline)
    except EngineError as exc:
        why = f"the Docker engine did not answer about it ({exc})"
    except Exception as exc:  # (its container is removed all the same, below)
        log.exception("session %s: re-adopting its kept container failed", kept.session)
        why = f"its re-adoption failed ({type(exc).__name__})"
    if why is None:
        settled(kept.session, None)
        return None
    log.warning("session %s: its kept container %s is not adopted: %s",
                kept.session, kept.name, why)
    with contextlib.suppress(EngineError, OSError):  # only a container of this instance
        await boxes.engine(_remove_if_ours, boxes.client, boxes.config.instance_name, kept.cid)
    if rundir is not None:
        await asyncio.to_thread(fstree.remove_tree_quietly, rundir / kept.token)
    settled(kept.session, why)
    return why


def _remove_if_ours(client: Engine, instance: str, cid: str) -> None:
    if any(c.startswith(cid) or cid.startswith(c) for c in engine.ours(client, instance)):
        engine.destroy(client, cid)


async def _reconnect(boxes: Boxes, sessions: SessionContainers, rundir: Path,
                     kept: Kept, deadline: float) -> str | None:
    owner = (kept.uid, kept.uid) if kept.uid is not None else None
    try:
        endpoint = await Endpoint.resume(rundir / kept.token, bytes.fromhex(kept.key), owner)
    except (OSError, ValueError) as exc:
        return f"its runner directory cannot be listened on ({exc})"
    try:
        done, _ = await within(endpoint.settled.wait(), deadline - time.monotonic())
    except BaseException:
        await endpoint.close(keep_dir=True)
        raise
    if not done or not endpoint.ready:
        await endpoint.close(keep_dir=True)
        return f"{NOT_BACK} ({endpoint.failure or 'no answer within adopt_timeout_s'})"
    shape = engine.Shape(**kept.shape)
    box = Box(name=kept.name, image=kept.image, shape=shape, endpoint=endpoint, role="session",
              cid=kept.cid, uid=kept.uid, kernel_calls=kept.kernel_calls,
              wheelhouse=kept.wheelhouse)
    boxes.live.add(box)
    sessions.by_key[(kept.client, kept.session, kept.lane or kept.image)] = box
    return None
