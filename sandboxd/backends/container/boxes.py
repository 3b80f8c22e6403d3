"""The containers themselves: :class:`Box` (one container and its runner endpoint) and
:class:`Boxes`, which creates and removes them through the engine's API (in a thread pool) and
keeps the backend's shared state: the engine client, the seccomp profile, the runner
directory, every live container, and those whose removal waits for the engine."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import stat
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sandboxd.backends.base import BackendUnavailable, CancelledAfterCleanup
from sandboxd.backends.container import engine, reaper
from sandboxd.backends.container.config import ContainerConfig
from sandboxd.backends.container.dockerapi import Engine
from sandboxd.backends.container.engine import Shape  # (in Boxes, engine is a method)
from sandboxd.backends.container.reaper import InitHandle
from sandboxd.backends.container.runner import Endpoint
from sandboxd.backends.container.watch import EngineWatch
from sandboxd.egress import sandbox as egress_sandbox
from sandboxd.egress.proxy import EgressProxy, Identity
from sandboxd.egress.resolve import Resolver
from sandboxd.egress.rules import EgressRules
from sandboxd.errors import ToolUnavailable
from sandboxd.host.uids import UidPool
from sandboxd.util.deadline import within
from sandboxd.workspaces import fstree

log = logging.getLogger("sandboxd.container")
T = TypeVar("T")
#: the containers that serve one call each (the warm pool's and cold one-shot ones): their
#: init is watched through a pidfd (reaper.py)
ONE_SHOT_ROLES = frozenset({"pool", "oneshot"})
#: how long the kernel may take to end a one-shot container's processes after SIGKILL before
#: the engine's removal is waited for instead
REAP_TIMEOUT_S = 5.0


@dataclass(eq=False)
class Box:
    """One sandbox container and its runner endpoint."""

    name: str
    image: str
    shape: engine.Shape
    endpoint: Endpoint
    role: str
    cid: str | None = None
    dead: bool = False
    uid: int | None = None
    note: str | None = None  # why its removal is not confirmed yet (engine outage)
    kernel_calls: int = 0  # calls run in its live session kernel (0: no kernel)
    paused: bool = False  # frozen by the engine (an idle session container: see idle.py)
    #: held while it is paused or thawed: a call never finds it half-way (see idle.py)
    freeze: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: a pidfd of its init, for a one-shot call's fast end (see reaper.py); None: the engine's
    init: InitHandle | None = None
    #: a session container made with the admin's wheelhouse mounted; None: not known (kept
    #: by a daemon that did not record it)
    wheelhouse: bool | None = False
    #: the egress proxy's identity of this container (None: no egress)
    egress: Identity | None = None
    #: made before its session had a client (a ready session's, :mod:`.ready`), with no
    #: network and no egress: its first call checks that it wants none either
    prestarted: bool = False


class Boxes:
    """Creates and removes the backend's containers; holds what every part of it shares."""

    def __init__(self, config: ContainerConfig, uids: UidPool | None) -> None:
        self.config = config
        self.uids = uids
        self.engine_client: Engine | None = None
        self.seccomp: str | None = None
        self.available: tuple[bool, str | None] = (False,
                                                   "the container backend is not started")
        self.executor: ThreadPoolExecutor | None = None  # made on first use, ended by close
        self.rundir: Path | None = None
        self.live: set[Box] = set()  # every live container, for close()
        self.closing = False
        # the engine's watch (see watch.py); containers whose removal waits for the engine
        self.watch: EngineWatch | None = None
        self.engine_error: str | None = None
        self.engine_failures = 0  # how many times a call saw it fail (see engine_failed)
        self.stale: set[Box] = set()
        #: removals under way in the background (:meth:`destroy_later`)
        self.removals: set[asyncio.Task[bool]] = set()
        #: the egress proxy of every container with egress rules (sandboxd.egress)
        self.egress_proxy = EgressProxy(Resolver(_resolver(config.egress_resolver)),
                                        ca_dir=config.state_dir / "egress",
                                        upstream_ca=config.egress_upstream_ca)

    async def engine(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking engine request in the backend's thread pool."""
        loop = asyncio.get_running_loop()
        if self.executor is None:
            self.executor = ThreadPoolExecutor(max_workers=16,
                                               thread_name_prefix="sandboxd-docker")
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def end_executor(self) -> None:
        """Let the engine threads end (the backend is closed; a later call makes new ones)."""
        if self.executor is not None:
            self.executor.shutdown(wait=False)
            self.executor = None

    @property
    def client(self) -> Engine:
        """The engine client; raises :class:`BackendUnavailable` while there is none."""
        if self.engine_client is None:
            raise BackendUnavailable(self.available[1] or "the Docker engine is unreachable")
        return self.engine_client

    def engine_failed(self, exc: BaseException) -> None:
        """A call saw the engine fail: remember why and let the watch check at once."""
        self.engine_error = str(exc) or type(exc).__name__
        self.engine_failures += 1
        if self.watch is not None:
            self.watch.wake.set()

    async def check_engine_after_lost_runner(self) -> None:
        """A runner went away: was it because its engine is stopping? Such an engine stops
        its containers after it has closed its listener, and still answers on the
        connections it had; so it is asked on a new one, and a refusal is the engine's
        failure (the call's result then says the engine went away)."""
        if self.engine_client is None or self.engine_error is not None:
            return
        try:
            await self.engine(self.engine_client.ping, fresh=True)
        except Exception as exc:
            self.engine_failed(exc)

    def prepare_rundir(self, keep: frozenset[str] = frozenset()) -> None:
        """The directory of the runners' sockets, ``<state>/run`` (a fresh one: leftovers of
        a crash go, their containers are gone after the sweep; but the directories ``keep`` of
        containers kept by the last clean stop stay for the next daemon to adopt). However long
        the state path, the sockets are bound there (:func:`runner.bind_unix`), never in
        ``/tmp``."""
        base = self.config.state_dir / "run"
        clear_rundir(base, keep)
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(base, 0o700)
        self.rundir = base

    def rundir_lost(self) -> str | None:
        """Why the runner directory is gone under the live backend (someone removed it), or
        None while it is there (one ``lstat``)."""
        if self.rundir is None or self.closing:
            return None
        try:
            st = os.lstat(self.rundir)
        except FileNotFoundError:
            return f"its runner directory {self.rundir} vanished (removed by someone else?)"
        except OSError as exc:
            return f"its runner directory {self.rundir} cannot be read: {exc.strerror}"
        if not stat.S_ISDIR(st.st_mode):
            return f"its runner directory {self.rundir} was replaced by something else"
        return None

    def restore_rundir(self) -> None:
        """Recreate a runner directory that vanished (0700, ours; not its parents). Something
        else in its place is left there: OSError, and the backend stays unavailable."""
        if self.rundir is None or self.rundir_lost() is None:
            return
        os.mkdir(self.rundir, 0o700)
        os.chmod(self.rundir, 0o700)

    async def new(self, *, image: str, shape: Shape, role: str, invocation: str,
                  workspace: Path | None, network: str | None = None,
                  session: str | None = None, uid: int | None = None,
                  egress: EgressRules | None = None, client: str = "",
                  tool: str = "") -> Box:
        """Create and start a container (its runner connects asynchronously). ``uid``: the
        sandbox identity of the call or session; None (warm pool): the container takes its
        own from the pool, until it is destroyed."""
        if self.rundir is None or self.seccomp is None:
            raise BackendUnavailable(self.available[1] or "the container backend is not started")
        token = secrets.token_hex(6)
        name = f"sandboxd-{self.config.instance_name}-{token}"
        if uid is None and self.uids is not None:
            uid = self.uids.acquire(name)
        try:
            endpoint = await Endpoint.open(self.rundir / token,
                                           (uid, uid) if uid is not None else None)
        except BaseException as exc:
            if self.uids is not None:
                self.uids.release(name)
            lost = self.rundir_lost() if isinstance(exc, OSError) else None
            if lost is not None:  # removed under us: a 503, not an error naming a path
                raise ToolUnavailable(f"the container backend is recovering: {lost}") from None
            raise
        wheelhouse = engine.mounts_wheelhouse(self.config, role)
        box = Box(name=name, image=image, shape=shape, endpoint=endpoint, role=role, uid=uid,
                  wheelhouse=wheelhouse)
        self.live.add(box)
        if egress is not None:
            box.egress = Identity(box=name, client=client, session=session, rules=egress,
                                  tool=tool)
            try:
                await egress_sandbox.prepare(self.egress_proxy, endpoint.rundir, uid,
                                             box.egress)
            except BaseException:
                await self.destroy(box)
                raise
        spec = engine.Spec(name=name, image=image, shape=shape, rundir=endpoint.rundir,
                           role=role, invocation=invocation, workspace=workspace,
                           network=network, session=session, uid=uid, wheelhouse=wheelhouse)
        task = asyncio.ensure_future(self.engine(
            _create, self.client, self.config, self.seccomp, spec, role in ONE_SHOT_ROLES))
        try:
            cid, pid = await asyncio.shield(task)
            box.cid = cid
        except asyncio.CancelledError:
            # the engine call runs on in its thread: wait for it, then remove what it made
            # (a second cancel must not skip the removal: it is swallowed here, on purpose)
            with contextlib.suppress(BaseException):
                box.cid, pid = await task
            verified = await self.destroy(box, by_name=True)
            raise CancelledAfterCleanup(verified, gone(box, verified)) from None
        except BaseException:
            await self.destroy(box, by_name=True)
            raise
        if pid:
            box.init = reaper.open_init(pid, cid)
        if box.egress is not None:
            await self._start_forwarder(box)
        return box

    async def new_within(self, new: Awaitable[Box], timeout: float) -> Box | None:
        """``new`` (a :meth:`new` call) within ``timeout`` seconds: the box, or None when it
        was not made in time (whatever it had started is removed). A box made just as the
        caller is cancelled is removed before the cancellation goes on, and the cancellation
        says so: dropped, it would run unseen until the backend closes."""
        made: list[Box] = []
        try:
            done, box = await within(new, timeout, orphan=made.append)
        except asyncio.CancelledError:
            if not made:
                raise
            verified = await self.destroy_holding_uid(made[0])
            raise CancelledAfterCleanup(verified, gone(made[0], verified)) from None
        return box if done else None

    async def _start_forwarder(self, box: Box) -> None:
        """Start the egress forwarder of ``box`` (removing the box when it does not come up)."""
        assert box.egress is not None and box.cid is not None
        user = f"{box.uid}:{box.uid}" if box.uid is not None else \
            f"{self.config.sandbox_uid}:{self.config.sandbox_gid}"
        cid = box.cid
        try:
            await egress_sandbox.start(
                self.egress_proxy, box.egress,
                lambda cmd: self.engine(self.client.exec_detached, cid, cmd, user),
                engine.RUNNER_MOUNT)
        except BaseException:
            await self.destroy(box)
            raise

    async def end(self, box: Box, *, fast: bool = True) -> tuple[bool, str]:
        """End a one-shot call's container: ``(verified, detail)``. When the kernel proves
        every process of it gone (:mod:`reaper`), at once, the engine's removal following in
        the background (awaited by :meth:`wait_removals`; a failed one is retried as
        :meth:`destroy` retries any); else (or unless ``fast``: its runner was lost, or the
        engine is failing, so its removal is what the result must report) the engine's
        removal, waited for."""
        init, box.init = box.init, None
        if init is not None and (not fast or self.engine_error is not None):
            init.close()
            init = None
        if init is not None:
            try:
                ended = await reaper.kill_and_prove(init, REAP_TIMEOUT_S)
            finally:
                init.close()
            if ended:
                self.destroy_later(box)
                return True, (f"every process of container {box.name} ended (its PID "
                              "namespace is empty); the engine removes it next")
        verified = await self.destroy_shielded(box)
        return verified, gone(box, verified)

    def destroy_later(self, box: Box) -> None:
        """:meth:`destroy` in the background (awaited by :meth:`wait_removals`)."""
        task = asyncio.ensure_future(self.destroy(box))
        self.removals.add(task)
        task.add_done_callback(self.removals.discard)

    async def wait_removals(self) -> None:
        """Wait for the background removals :meth:`destroy_later` started."""
        while self.removals:
            await asyncio.gather(*list(self.removals), return_exceptions=True)

    async def destroy(self, box: Box, *, by_name: bool = False) -> bool:
        """Remove the container and its endpoint; True once the engine confirms it is gone."""
        box.dead = True
        if box.init is not None:
            box.init.close()
            box.init = None
        self.live.discard(box)
        ref = box.cid or (box.name if by_name else None)
        verified = True
        if ref is not None and self.engine_client is not None:
            if box.paused:  # thawed first (best effort: the engine removes a paused one too)
                with contextlib.suppress(Exception):
                    await self.engine(engine.unpause, self.engine_client, ref)
                box.paused = False
            try:
                verified = await self.engine(engine.destroy, self.engine_client, ref)
            except Exception as exc:
                self.engine_failed(exc)
                verified = False
        await box.endpoint.close()
        if box.egress is not None:
            await self.egress_proxy.detach(box.egress)
        if verified:
            self.stale.discard(box)
            box.note = None
            if self.uids is not None:
                self.uids.release(box.name)  # a warm container's own uid (no-op for others)
        else:
            self.stale.add(box)  # removed (and its uid freed) when the engine is back
            if self.engine_error:
                box.note = ("the Docker engine is unreachable; the container is removed when "
                            "it is back")
        return verified

    async def destroy_shielded(self, box: Box) -> bool:
        """:meth:`destroy`, carried to its end even when the caller is cancelled."""
        return await _carried(self.destroy(box))

    async def destroy_holding_uid(self, box: Box) -> bool:
        """:meth:`destroy_shielded` of a box that runs as a session's uid: unconfirmed (the
        engine is away), the box keeps holding that uid under its own name until it is
        (:meth:`destroy` frees it then): a uid is free only when nothing runs as it."""
        verified = await self.destroy_shielded(box)
        if not verified and box.uid is not None and self.uids is not None:
            self.uids.hold_also(box.name, box.uid)
        return verified

    async def end_shielded(self, box: Box, *, fast: bool = True) -> tuple[bool, str]:
        """:meth:`end`, carried to its end even when the caller is cancelled."""
        return await _carried(self.end(box, fast=fast))

    async def update_shape(self, box: Box, shape: Shape) -> None:
        """Give ``box`` the limits of ``shape`` (one engine call, only when they differ)."""
        if box.shape != shape:
            await self.engine(engine.update_shape, self.client, box.cid or box.name, shape)
            box.shape = shape


async def _carried(aw: Awaitable[T]) -> T:
    """Await ``aw`` to its end even when the caller is cancelled meanwhile (the cancellation
    goes on once it has ended)."""
    task = asyncio.ensure_future(aw)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


def _create(client: Engine, config: ContainerConfig, seccomp: str,
            spec: engine.Spec, want_pid: bool) -> tuple[str, int]:
    """Create and start the container; its id, and its init's pid when ``want_pid``."""
    cid = engine.create_and_start(client, config, seccomp, spec)
    return cid, engine.init_pid(client, cid) if want_pid else 0


def clear_rundir(base: Path, keep: frozenset[str] = frozenset()) -> None:
    """Remove the runner directory ``base``, or only its entries but ``keep``."""
    if not keep or not base.is_dir() or base.is_symlink():
        fstree.remove_tree_quietly(base)
        return
    for entry in base.iterdir():
        if entry.name not in keep:
            fstree.remove_tree_quietly(entry)


def gone(box: Box | None, verified: bool) -> str:
    """What became of a call's container, for the result's cleanup detail."""
    if box is None:
        return "no container was started"
    if verified:
        return f"container {box.name} removed"
    return (f"the engine did not confirm the removal of container {box.name}"
            + (f": {box.note}" if box.note else ""))


def runner_lost(box: Box) -> bool:
    """The container's runner channel broke (the container stopped) or never came up."""
    channel = box.endpoint.channel
    return (channel is not None and channel.broken is not None) or box.endpoint.failure is not None


def _resolver(setting: str | None) -> tuple[str, int] | None:
    """The ``egress_resolver`` setting as an address (None: the host's resolver)."""
    if setting is None:
        return None
    host, _, port = setting.rpartition(":")
    return host.strip("[]"), int(port)
