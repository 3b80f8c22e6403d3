"""The container backend: every call runs in a locked-down Docker container, as the uid of
its sandbox (a one-shot call's, a session's, or a warm container's own) from the daemon's uid
pool (:mod:`sandboxd.host.uids`): no two live containers share a uid.

Three ways a call gets a container (all with the same confinement, see :mod:`.engine`):

* **warm pool** (one-shot calls, the common case): containers created and started ahead of
  time, each with its runner connected and a private tmpfs at ``/workspace`` limited in bytes
  and inodes like every workspace (``session_quota_bytes``/``session_quota_entries``); a
  call takes one, runs once (a fork inside the container), and the container is destroyed;
  the pool refills in the background. A one-shot call's workspace is fresh and empty by
  design, so a container's private ``/workspace`` is equivalent (a call with a named network
  gets a fresh container, with its own tmpfs too); only when the daemon hands in a non-empty
  workspace is it bind-mounted instead.
* **session containers**: one per (client, session, image), with the session workspace
  bind-mounted at ``/workspace``; each command call is one fork of the runner inside it, and
  each ``python`` call runs in the session's kernel, a persistent interpreter the runner keeps
  in the container (:mod:`.sessions`). One idle for ``session_pause_after_s`` is paused
  and thawed at its next call (:mod:`.idle`). The container
  is removed by ``close_session`` (DELETE, TTL), at shutdown, and after any call that hit a
  limit (memory, pids, output) or whose kernel was not proven idle - the next call starts a
  fresh one on the same workspace. At a timeout or a cancel the kernel is interrupted first
  (a runaway call need not cost the session its state) and the container kept when the
  kernel comes back within the grace.
* **cold** one-shot containers when the pool is empty or cannot serve the call.

Limits: memory (= memory+swap), CPU and pids are container limits, changed in place with one
``update`` call when a call's limits differ from the container's; output is capped by the
runner and again here; the wall deadline is enforced here. OOM is read from the container's
cgroup by the runner (``memory.events``/``memory.oom_control``) and from ``State.OOMKilled``.

The runner channel (:mod:`.runner`): one authenticated connection per container, made by the
runner before any user code exists, after which the socket and its key are gone; calls are
multiplexed on it and everything the runner sends is bounded and validated.

Modules: :mod:`.boxes` (creating and removing containers), :mod:`.pool` (the warm pool),
:mod:`.sessions` (session containers), :mod:`.oneshot` (one-shot calls), :mod:`.calls` (one
call's request, exchange and result), :mod:`.probe` (the self-test); this one sequences them.

A known limit, written down: a session container's processes that escape their
call's process group (``setsid``) live until the session container is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Any

from sandboxd.backends.base import Backend, BackendUnavailable
from sandboxd.backends.call import BackendCall
from sandboxd.backends.capabilities import (
    ImageBuilder,
    KernelLanguages,
    Pausable,
    SelfHealing,
    SessionKeeper,
)
from sandboxd.backends.container import adopt, engine
from sandboxd.backends.container.boxes import Boxes, clear_rundir
from sandboxd.backends.container.build import ImageBuilds
from sandboxd.backends.container.calls import ContainerCall, request_for
from sandboxd.backends.container.config import ContainerConfig
from sandboxd.backends.container.dockerapi import APIError, Engine, EngineError
from sandboxd.backends.container.oneshot import run_oneshot
from sandboxd.backends.container.pool import WarmPool
from sandboxd.backends.container.probe import run_probe
from sandboxd.backends.container.ready import ReadyContainers
from sandboxd.backends.container.sessions import SessionContainers
from sandboxd.backends.container.watch import PING_TIMEOUT_S, EngineWatch
from sandboxd.config import Settings
from sandboxd.errors import ToolUnavailable
from sandboxd.host.uids import UidPool
from sandboxd.models import (
    Cleanup,
    Invocation,
    Kernel,
    ProbeReport,
    Reason,
    Result,
    Status,
    ToolKind,
)
from sandboxd.protocol.plan import KERNEL_KINDS
from sandboxd.util.deadline import stop_task

log = logging.getLogger("sandboxd.container")

PROBE_CACHE_S = 60.0  # confinement does not change at run time; /readyz may poll often


class ContainerBackend(Backend, KernelLanguages, Pausable, ImageBuilder, SelfHealing,
                       SessionKeeper):
    """Docker containers as the sandbox (see the module docstring)."""

    name = "container"

    def __init__(self, config: ContainerConfig, uids: UidPool | None = None) -> None:
        self.config = config
        self.uids = uids if uids is not None else UidPool.for_range(
            config.sandbox_uid_first, config.sandbox_uid_count)
        self.boxes = Boxes(config, self.uids)
        self.pool = WarmPool(self.boxes)
        self.sessions = SessionContainers(self.boxes)
        self.ready = ReadyContainers(self.boxes, self.sessions)  # ready sessions' containers
        self._probe_cache: tuple[float, ProbeReport] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._ping_client: Engine | None = None
        #: what of the backend's own vanished under it, while it rebuilds (see :meth:`_damaged`)
        self.healing: str | None = None
        # restarts keep sessions (:mod:`.adopt`): the recovered sessions the service
        # expects, the records of the last stop (until adopted), what did not check out, and
        # the ids of the containers this stop keeps (spared by close)
        self.expected: adopt.Expected = {}
        self._records: list[adopt.Kept] | None = None
        self.adoption_failed: dict[str, str] = {}
        self.kept: set[str] = set()
        #: the missing images this daemon builds itself (setting ``build_images``, :mod:`.build`)
        self.builds = ImageBuilds(config, self._built)
        # the start's re-adoption, in the background while the daemon serves: its task, and
        # the container ids and sessions of the records it has not settled yet
        self._adoption: asyncio.Task[None] | None = None
        self._adopting: frozenset[str] = frozenset()
        #: per session with a record: set once it is settled, unless it failed a check that
        #: ends the session (a call of it then waits for the whole round)
        self._settled: dict[str, asyncio.Event] = {}

    @classmethod
    def from_settings(cls, settings: Settings, uids: UidPool | None = None) -> ContainerBackend:
        """The backend as the daemon builds it from its settings."""
        return cls(ContainerConfig.from_settings(settings), uids)

    def _image_for(self, invocation: Invocation) -> str:
        if invocation.plan.image:
            return invocation.plan.image
        if invocation.plan.kind is ToolKind.python:
            return self.config.python_image
        return self.config.shell_image

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect, sweep leftovers of a crash, and fill the warm pool."""
        boxes = self.boxes
        boxes.closing = False
        try:
            boxes.seccomp = engine.load_seccomp(self.config)
        except (OSError, ValueError) as exc:
            boxes.available = (False, f"cannot read the seccomp profile: {exc}")
            return
        self.builds.start()  # in the background: the images are checked by _connect meanwhile
        self._records = await asyncio.to_thread(adopt.load, self.config.state_dir)
        self.kept = set()
        boxes.prepare_rundir(frozenset(r.token for r in self._records))
        connected = await self._connect()
        boxes.watch = EngineWatch(self._ping, self._lost, self._connect, is_up=connected)
        self._watch_task = asyncio.create_task(boxes.watch.run(), name="docker-engine-watch")
        self.sessions.idle.start(self.sessions.by_key)

    async def _connect(self) -> bool:
        """(Re)connect: sweep our leftovers (of a crash or an outage), check the images, and
        (re)fill the warm pool. True when the backend is available."""
        boxes = self.boxes
        try:
            client = await boxes.engine(engine.connect, self.config)
            await boxes.engine(client.ping)
        except Exception as exc:
            boxes.available = (False, f"the Docker engine is unreachable: {exc}")
            return False
        old, boxes.engine_client = boxes.engine_client, client
        if old is not None:
            with contextlib.suppress(Exception):
                old.close()
        stale, boxes.stale = list(boxes.stale), set()
        await asyncio.gather(*(boxes.destroy(b) for b in stale), return_exceptions=True)
        if self.healing is not None or boxes.rundir_lost():
            try:
                boxes.restore_rundir()
            except OSError as exc:
                boxes.available = (False, f"the container backend is recovering: "
                                   f"{self.healing or boxes.rundir_lost()}; it cannot be "
                                   f"recreated yet: {exc.strerror or exc}")
                return False
        if self._records is not None and boxes.rundir is not None:
            records, self._records = self._records, None
            self._adopting = frozenset(r.cid for r in records)
            self._settled = {r.session: asyncio.Event() for r in records}
            self._adoption = asyncio.create_task(self._adopt(records), name="container-adopt")
        # a kept container still being re-adopted is not swept
        keep = frozenset(b.cid for b in boxes.live if b.cid) | self._adopting
        try:
            removed = await boxes.engine(engine.sweep, client, self.config.instance_name, keep)
        except Exception as exc:
            boxes.available = (False, f"the Docker engine is unreachable: {exc}")
            return False
        if removed:
            log.warning("removed %d container(s) left by a previous run or an engine outage",
                        len(removed))
        images = {self.config.python_image, self.config.shell_image}
        built = self.builds.awaiting_check()  # ended before this check: it answers for them
        for image in sorted(images):
            problem = await boxes.engine(engine.image_problem, client, image)
            if problem:
                boxes.available = (False, problem)
                self.builds.settle(built)
                return False
        self.builds.settle(built)
        boxes.engine_error = None
        self._probe_cache = None
        boxes.available = (True, None)
        if self.healing is not None:
            log.warning("container backend recovered: %s; runner directory and warm pool "
                        "recreated", self.healing)
            self.healing = None
        self.pool.start(images)
        return True

    def _built(self) -> None:
        """An image build ended: check the images now (the engine watch reconnects when they
        were missing), not at the watch's next backoff."""
        watch = self.boxes.watch
        if watch is None or watch.is_up:  # it reconnects (and checks them) only when down
            self.builds.settle(self.builds.awaiting_check())
        if watch is not None:
            watch.wake.set()

    async def _ping(self) -> None:
        """Raises when the engine does not answer (a client with a short timeout). Also the
        check that the runner directory is still there (see :meth:`_damaged`)."""
        lost = self.boxes.rundir_lost()
        if lost is not None and self.boxes.available[0]:
            self._damaged(lost)
            return
        loop = asyncio.get_running_loop()
        if self._ping_client is None:
            self._ping_client = await loop.run_in_executor(
                None, functools.partial(engine.connect, self.config, PING_TIMEOUT_S))
        failures = self.boxes.engine_failures
        # on a new connection: a stopping engine still answers on those it had
        await loop.run_in_executor(None, functools.partial(self._ping_client.ping, fresh=True))
        self._answering_again(failures)

    def _answering_again(self, failures: int) -> None:
        """The engine answered a new connection (and was not marked down): a failure a call
        saw before the ping began is forgotten (a later lost runner is the runner's own
        story), and containers whose removal failed are removed again, in the background."""
        boxes = self.boxes
        if boxes.engine_failures == failures:
            boxes.engine_error = None
        stale, boxes.stale = list(boxes.stale), set()
        for box in stale:  # one that fails again is back in ``stale``
            boxes.destroy_later(box)

    async def _lost(self, why: str) -> None:
        """The engine went away: unavailable now; the warm pool and session containers are
        dead (the engine stops containers); they are removed when it is back."""
        self.boxes.engine_error = why
        self.boxes.available = (False, f"the Docker engine is unreachable: {why}")
        self._probe_cache = None
        self.pool.lost()
        self.sessions.lost()

    async def _adopt(self, records: list[adopt.Kept]) -> None:
        """Re-adopt what the last stop kept (:mod:`.adopt`), within ``adopt_timeout_s``."""
        deadline = time.monotonic() + self.config.adopt_timeout_s
        def settled(session: str, why: str | None) -> None:
            if why is None or adopt.keeps_session(why):
                self._settled[session].set()

        try:
            self.adoption_failed = await adopt.adopt(self.boxes, self.sessions, records,
                                                     self.expected, deadline, settled)
        finally:
            self._adopting = frozenset()

    @property
    def adopting(self) -> bool:
        """The start's re-adoption is still under way."""
        return self._adoption is not None and not self._adoption.done()

    async def adopted(self, session_id: str | None = None) -> None:
        """Until the start's re-adoption has ended, or (``session_id``) settled that session's
        kept container; at once when there is none."""
        task = self._adoption
        if task is None or task.done():
            return
        event = self._settled.get(session_id) if session_id is not None else None
        if session_id is not None and (event is None or event.is_set()):
            return
        waits: set[asyncio.Future[Any]] = {asyncio.shield(task)}
        if event is not None:
            waits.add(asyncio.ensure_future(event.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()  # (the shield's outer future: the round itself goes on)

    def expect_sessions(self, expected: adopt.Expected) -> None:
        """Before :meth:`start`: the sessions the service recovered from the last stop; a
        container
        kept by the last stop is adopted only for one of them."""
        self.expected = dict(expected)

    async def keep_sessions(self, session_ids: set[str]) -> set[str]:
        """At a clean stop that keeps sessions, before :meth:`close`: keep the session
        containers (and kernels) of ``session_ids`` running for the next daemon
        (:mod:`.adopt`); returns the sessions whose container was kept."""
        kept = {key[1] for key in self.sessions.by_key}
        await adopt.keep(self.boxes, self.sessions, session_ids, self.kept)
        return kept - {key[1] for key in self.sessions.by_key}

    async def close(self) -> None:
        """Remove every container this backend started (but those :meth:`keep_sessions`
        kept)."""
        boxes = self.boxes
        boxes.closing = True
        await self.builds.close()
        await stop_task(self._adoption)  # what it had not adopted yet is removed below
        await stop_task(self._watch_task)
        self._watch_task = None
        if self._ping_client is not None:
            with contextlib.suppress(Exception):
                self._ping_client.close()
            self._ping_client = None
        await self.pool.stop()
        await self.sessions.idle.stop()
        live = list(boxes.live)
        await asyncio.gather(*(boxes.destroy(b) for b in live), return_exceptions=True)
        await boxes.wait_removals()
        self.pool.queues.clear()
        self.sessions.by_key.clear()
        if boxes.engine_client is not None:
            with contextlib.suppress(Exception):
                await boxes.engine(engine.sweep, boxes.engine_client, self.config.instance_name,
                                   frozenset(self.kept))
            with contextlib.suppress(Exception):
                boxes.engine_client.close()
            boxes.engine_client = None
        if boxes.rundir is not None:
            kept_dirs = frozenset(r.token for r in adopt.load(self.config.state_dir))
            await asyncio.to_thread(clear_rundir, boxes.rundir, kept_dirs)
        boxes.end_executor()
        boxes.available = (False, "the container backend is stopped")

    def _damaged(self, why: str) -> None:
        """Something of the backend's own vanished under the live daemon (its runner
        directory: an ``rm -rf`` by someone else): unavailable at once (calls get 503, the
        daemon is not ready) until the engine watch has rebuilt it: runner directory
        recreated, every container of the backend replaced (they were bound to it; session
        kernels are lost, their files stay), probe run again."""
        log.error("container backend: %s; recovering", why)
        self.healing = why
        self.boxes.available = (False, f"the container backend is recovering: {why}")
        self._probe_cache = None
        self.pool.lost()
        self.sessions.lost()
        watch = self.boxes.watch
        if watch is not None:  # its next round (within CHECK_S) rebuilds: up() = _connect
            watch.is_up = False

    def availability(self) -> tuple[bool, str | None]:
        """Engine reachable, images present and the runner directory there (one ``lstat``);
        the rest is cached from start-up or the last failure."""
        if self.boxes.available[0]:
            lost = self.boxes.rundir_lost()
            if lost is not None:
                self._damaged(lost)
        ok, why = self.boxes.available
        if not ok:  # an image missing: its build under way, or why it failed
            for image in (self.config.python_image, self.config.shell_image):
                building = self.builds.unavailable(image)
                if building is not None:
                    pending = self.builds.pending(image)
                    return False, building if pending else f"{why}; {building}"
        return ok, why

    def building(self) -> dict[str, dict[str, object]]:
        """The image builds of this daemon (``/readyz``), by the image each makes."""
        return self.builds.report()

    async def _image_unavailable(self, image: str) -> str | None:
        """Why a call cannot have ``image`` because of this daemon's build of it (a policy's
        image, e.g. the data-science profile's): the image is missing and its build is under
        way or failed. One that is there serves, even while its build checks or renews it."""
        why = self.builds.unavailable(image)
        client = self.boxes.engine_client
        if why is None or client is None:
            return why
        return why if await self.boxes.engine(engine.image_problem, client, image) else None

    # ------------------------------------------------------------ run

    async def run(self, invocation: Invocation, deadline: float) -> Result:
        """Execute one call (see the module docstring)."""
        call = BackendCall(invocation, deadline)  # its wall time runs from here
        lost = self.boxes.rundir_lost()
        if lost is not None:  # vanished after the service checked availability(): a 503 too
            self._damaged(lost)
            raise ToolUnavailable(f"tool '{invocation.tool}' is unavailable here: the "
                                  f"container backend is recovering: {lost}")
        if invocation.session is not None:
            await self.adopted(invocation.session)  # its kept container may come back
        image = self._image_for(invocation)
        building = await self._image_unavailable(image)
        if building is not None:
            raise ToolUnavailable(f"tool '{invocation.tool}' is unavailable here: {building}")
        kernel_call = invocation.session is not None and invocation.plan.kind in KERNEL_KINDS
        request = request_for(call)
        if isinstance(request, Result):
            if kernel_call:  # refused before it reached the session's kernel
                return request.model_copy(
                    update={"kernel": self.sessions.kernel_now(invocation, image)})
            return request
        container_call = ContainerCall(call, request, image, engine.Shape.of(call.limits))
        # a kernel call's session had a live kernel (None: not a kernel call)
        had_kernel = self.sessions.kernel_now(invocation, image).calls > 0 if kernel_call else None
        try:
            if invocation.session is not None:
                return await self.sessions.run(container_call)
            return await run_oneshot(self.boxes, self.pool, container_call)
        except (EngineError, BackendUnavailable) as exc:
            # e.g. an image or network named by a policy does not exist, or the engine went
            # away; whatever was created has been removed (or is, once the engine is back)
            return self._not_started(call, exc, had_kernel)

    def _not_started(self, call: BackendCall, exc: EngineError | BackendUnavailable,
                     had_kernel: bool | None) -> Result:
        """The result of a call whose container could not be started (an image or network
        named by a policy does not exist, or the engine went away); ``had_kernel``: a kernel
        call's session had a live kernel, which is gone with its container (None: not a
        kernel call)."""
        detail = getattr(exc, "explanation", None) or str(exc)
        message = f"the sandbox container could not be started: {detail}"
        cleanup = Cleanup(verified=True)
        if not isinstance(exc, APIError):  # no answer at all
            self.boxes.engine_failed(exc)
            message = f"the Docker engine went away: {detail}"
            stale = self.boxes.stale
            cleanup = Cleanup(verified=not stale, detail=None if not stale else
                              "the Docker engine is unreachable; containers of the call "
                              "are removed when it is back")
        kernel = None
        if had_kernel is not None:  # the session's container, and its kernel if any, is gone
            kernel = Kernel(lost=had_kernel, reason=Reason.exited.value if had_kernel
                            else None)
        return Result.build(call.invocation, self.name, Reason.exited, status=Status.error,
                            limits=call.limits, started=call.started, cleanup=cleanup,
                            message=message, kernel=kernel)

    async def close_session(self, session_id: str) -> None:
        """Remove the session's container(s). Idempotent."""
        await self.adopted(session_id)  # its kept container, once adopted, goes too
        await self.sessions.close(session_id)

    def kernel_sessions(self) -> set[str]:
        """Sessions whose container has a live Python kernel."""
        return self.sessions.kernel_sessions()

    def session_kernels(self) -> set[tuple[str, str]]:
        """``(session, language)`` of each session container's live kernel."""
        return self.sessions.session_kernels()

    def paused_sessions(self) -> set[str]:
        """Sessions whose container is paused now (idle; thawed at their next call)."""
        return self.sessions.paused_sessions()

    def interrupt_kernel(self, session_id: str) -> bool:
        """Interrupt the call in the session container's kernel."""
        return self.sessions.interrupt_kernel(session_id)

    async def restart_kernel(self, session_id: str) -> bool:
        """End the session's kernel (the runner kills it; container and files are kept)."""
        return await self.sessions.restart_kernel(session_id)

    async def pause_session(self, session_id: str) -> bool:
        """Pause the session's container now, as idle pausing does (thawed at its next call)."""
        return await self.sessions.pause_session(session_id)

    async def resume_session(self, session_id: str) -> bool:
        """Thaw the session's paused container (its kernel's state intact)."""
        return await self.sessions.resume_session(session_id)

    # ------------------------------------------------------------ readiness

    async def probe(self) -> ProbeReport:
        """Prove confinement by running probes in real containers (one-shot path)."""
        ok, why = self.availability()
        if not ok:
            return ProbeReport(backend=self.name, ok=False, detail=why or "unavailable")
        cached = self._probe_cache
        if cached is not None and time.monotonic() - cached[0] < PROBE_CACHE_S:
            return cached[1]
        report = await run_probe(self)
        self._probe_cache = (time.monotonic(), report) if report.ok else None
        return report
