"""The container backend: every call runs in a locked-down Docker container, as the uid of
its sandbox (a one-shot call's, a session's, or a warm container's own) from the daemon's uid
pool (:mod:`sandboxd.uids`): no two live containers share a uid.

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
  bind-mounted at ``/workspace``; each call is one fork of the runner inside it. The container
  is removed by ``close_session`` (DELETE, TTL), at shutdown, and after any call that hit a
  limit (timeout, memory, pids, output, cancellation) - the next call starts a fresh one on
  the same workspace.
* **cold** one-shot containers when the pool is empty or cannot serve the call.

Limits: memory (= memory+swap), CPU and pids are container limits, changed in place with one
``update`` call when a call's limits differ from the container's; output is capped by the
runner and again here; the wall deadline is enforced here. OOM is read from the container's
cgroup by the runner (``memory.events``/``memory.oom_control``) and from ``State.OOMKilled``.

The runner channel (:mod:`.runner`): one authenticated connection per container, made by the
runner before any user code exists, after which the socket and its key are gone; calls are
multiplexed on it and everything the runner sends is bounded and validated.

Known limit of the design, written down: a session container's processes that escape their
call's process group (``setsid``) live until the session container is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import tempfile
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import docker
import requests

from sandboxd import fstree
from sandboxd.backends.base import BackendUnavailable, CancelledAfterCleanup
from sandboxd.backends.container import engine
from sandboxd.backends.container.runner import CallOutput, Endpoint, RunnerLost
from sandboxd.backends.container.watch import PING_TIMEOUT_S, EngineWatch
from sandboxd.config import Settings
from sandboxd.deadline import within
from sandboxd.models import (
    Cleanup,
    Invocation,
    Limits,
    Plan,
    ProbeCheck,
    ProbeReport,
    Reason,
    Resources,
    Result,
    Status,
    ToolKind,
    Truncated,
    status_for,
)
from sandboxd.uids import UidPool

log = logging.getLogger("sandboxd.container")
T = TypeVar("T")

POOL_MEMORY_SHARE = 0.25  # idle pool containers may reserve at most this share of free memory
POOL_PARALLEL_STARTS = 2
MAX_CODE_BYTES = 4 * 1024 * 1024
PROBE_CLIENT = "sandboxd-probe"
RUNNER_CONNECT_S = 15.0  # a started container's runner connects well within this
PROBE_CACHE_S = 60.0  # confinement does not change at run time; /readyz may poll often


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


class ContainerBackend:
    """Docker containers as the sandbox (see the module docstring)."""

    name = "container"

    def __init__(self, settings: Settings, uids: UidPool | None = None) -> None:
        self.settings = settings
        self.uids = uids if uids is not None else UidPool.from_settings(settings)
        self._client: docker.DockerClient | None = None
        self._seccomp: str | None = None
        self._available: tuple[bool, str | None] = (False, "the container backend is not started")
        self._executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="sandboxd-docker")
        self._rundir: Path | None = None
        self._pool: dict[str, deque[Box]] = {}
        self._pool_shape: dict[str, engine.Shape] = {}
        self._filling: dict[str, int] = {}
        self._refill = asyncio.Event()
        self._refill_task: asyncio.Task[None] | None = None
        self._sessions: dict[tuple[str, str, str], Box] = {}
        self._session_locks: dict[tuple[str, str, str], asyncio.Lock] = {}
        self._boxes: set[Box] = set()  # every live container, for close()
        self._closing = False
        self._probe_cache: tuple[float, ProbeReport] | None = None
        # the engine's watch (see watch.py); containers whose removal waits for the engine
        self._watch: EngineWatch | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._ping_client: docker.DockerClient | None = None
        self._engine_error: str | None = None
        self._stale: set[Box] = set()
        self._reaping: set[asyncio.Future[bool]] = set()

    # ------------------------------------------------------------ helpers

    async def _engine(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking docker SDK call in the backend's thread pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            raise BackendUnavailable(self._available[1] or "the Docker engine is unreachable")
        return self._client

    def _image_for(self, invocation: Invocation) -> str:
        if invocation.image:
            return invocation.image
        if invocation.kind is ToolKind.python:
            return self.settings.python_image
        return self.settings.shell_image

    def _pool_target(self) -> int:
        size = self.settings.warm_pool_size
        if size <= 0:
            return 0
        try:
            import psutil

            free = psutil.virtual_memory().available
            per = max(s.memory for s in self._pool_shape.values()) if self._pool_shape else (
                Limits().memory_bytes)
            size = min(size, max(1, int(free * POOL_MEMORY_SHARE) // per))
        except Exception:  # psutil missing or odd host: trust the setting
            pass
        return size

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect, sweep leftovers of a crash, and fill the warm pool."""
        self._closing = False
        try:
            self._seccomp = engine.load_seccomp(self.settings)
        except (OSError, ValueError) as exc:
            self._available = (False, f"cannot read the seccomp profile: {exc}")
            return
        self._prepare_rundir()
        connected = await self._connect()
        self._watch = EngineWatch(self._ping, self._lost, self._connect, is_up=connected)
        self._watch_task = asyncio.create_task(self._watch.run(), name="docker-engine-watch")

    async def _connect(self) -> bool:
        """(Re)connect: sweep our leftovers (of a crash or an outage), check the images, and
        (re)fill the warm pool. True when the backend is available."""
        try:
            client = await self._engine(engine.connect, self.settings)
            await self._engine(client.ping)
        except Exception as exc:
            self._available = (False, f"the Docker engine is unreachable: {exc}")
            return False
        old, self._client = self._client, client
        if old is not None:
            with contextlib.suppress(Exception):
                old.close()
        stale, self._stale = list(self._stale), set()
        await asyncio.gather(*(self._destroy(b) for b in stale), return_exceptions=True)
        keep = frozenset(b.cid for b in self._boxes if b.cid)
        try:
            removed = await self._engine(engine.sweep, client, self.settings.instance_name, keep)
        except Exception as exc:
            self._available = (False, f"the Docker engine is unreachable: {exc}")
            return False
        if removed:
            log.warning("removed %d container(s) left by a previous run or an engine outage",
                        len(removed))
        images = {self.settings.python_image, self.settings.shell_image}
        for image in sorted(images):
            problem = await self._engine(engine.image_problem, client, image)
            if problem:
                self._available = (False, problem)
                return False
        self._engine_error = None
        self._probe_cache = None
        self._available = (True, None)
        for image in sorted(images):
            self._pool.setdefault(image, deque())
            self._pool_shape.setdefault(image, engine.Shape.of(Limits()))
        if self._refill_task is None:
            self._refill_task = asyncio.create_task(self._refill_loop(), name="container-pool")
        self._refill.set()
        return True

    async def _ping(self) -> None:
        """Raises when the engine does not answer (a client with a short timeout)."""
        loop = asyncio.get_running_loop()
        if self._ping_client is None:
            self._ping_client = await loop.run_in_executor(
                None, functools.partial(engine.connect, self.settings, PING_TIMEOUT_S))
        await loop.run_in_executor(None, self._ping_client.ping)

    async def _lost(self, why: str) -> None:
        """The engine went away: unavailable now; the warm pool and session containers are
        dead (the engine stops containers); they are removed when it is back."""
        self._engine_error = why
        self._available = (False, f"the Docker engine is unreachable: {why}")
        self._probe_cache = None
        for boxes in self._pool.values():
            while boxes:
                box = boxes.popleft()
                box.dead = True
                self._stale.add(box)
        for key, box in list(self._sessions.items()):
            box.dead = True
            del self._sessions[key]
            self._stale.add(box)

    def _engine_failed(self, exc: BaseException) -> None:
        """A call saw the engine fail: remember why and let the watch check at once."""
        self._engine_error = str(exc) or type(exc).__name__
        if self._watch is not None:
            self._watch.wake.set()

    def _prepare_rundir(self) -> None:
        base = self.settings.state_dir / "run"
        longest = base / ("x" * 16) / "runner.sock"
        if len(str(longest)) < 100:
            # leftovers of a crashed daemon: their containers are gone after the sweep
            fstree.remove_tree_quietly(base)
            base.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(base, 0o700)
            self._rundir = base
        else:  # unix socket paths are limited to 108 bytes
            self._rundir = Path(tempfile.mkdtemp(prefix="sandboxd-run-"))

    async def close(self) -> None:
        """Remove every container this backend started."""
        self._closing = True
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch_task
            self._watch_task = None
        if self._ping_client is not None:
            with contextlib.suppress(Exception):
                self._ping_client.close()
            self._ping_client = None
        if self._refill_task is not None:
            self._refill_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._refill_task
            self._refill_task = None
        boxes = list(self._boxes)
        await asyncio.gather(*(self._destroy(b) for b in boxes), return_exceptions=True)
        self._pool.clear()
        self._sessions.clear()
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._engine(engine.sweep, self._client, self.settings.instance_name)
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        if self._rundir is not None:
            await asyncio.to_thread(fstree.remove_tree_quietly, self._rundir)
        self._available = (False, "the container backend is stopped")

    def availability(self) -> tuple[bool, str | None]:
        """Cached: engine reachable and images present at start-up (or last failure)."""
        return self._available

    # ------------------------------------------------------------ containers

    async def _new_box(self, *, image: str, shape: engine.Shape, role: str, invocation: str,
                       workspace: Path | None, network: str | None = None,
                       session: str | None = None, uid: int | None = None) -> Box:
        """Create and start a container (its runner connects asynchronously). ``uid``: the
        sandbox identity of the call or session; None (warm pool): the container takes its
        own from the pool, until it is destroyed."""
        if self._rundir is None or self._seccomp is None:
            raise BackendUnavailable(self._available[1] or "the container backend is not started")
        token = secrets.token_hex(6)
        name = f"sandboxd-{self.settings.instance_name}-{token}"
        if uid is None and self.uids is not None:
            uid = self.uids.acquire(name)
        try:
            endpoint = await Endpoint.open(self._rundir / token,
                                           (uid, uid) if uid is not None else None)
        except BaseException:
            if self.uids is not None:
                self.uids.release(name)
            raise
        box = Box(name=name, image=image, shape=shape, endpoint=endpoint, role=role, uid=uid)
        self._boxes.add(box)
        spec = engine.Spec(name=name, image=image, shape=shape, rundir=endpoint.rundir,
                           role=role, invocation=invocation, workspace=workspace,
                           network=network, session=session, uid=uid)
        task = asyncio.ensure_future(self._engine(
            engine.create_and_start, self.client, self.settings, self._seccomp, spec))
        try:
            box.cid = await asyncio.shield(task)
        except asyncio.CancelledError:
            # the engine call runs on in its thread: wait for it, then remove what it made
            with contextlib.suppress(BaseException):
                box.cid = await task
            verified = await self._destroy(box, by_name=True)
            raise CancelledAfterCleanup(verified, _gone(box, verified)) from None
        except BaseException:
            await self._destroy(box, by_name=True)
            raise
        return box

    async def _destroy(self, box: Box, *, by_name: bool = False) -> bool:
        """Remove the container and its endpoint; True once the engine confirms it is gone."""
        box.dead = True
        self._boxes.discard(box)
        ref = box.cid or (box.name if by_name else None)
        verified = True
        if ref is not None and self._client is not None:
            try:
                verified = await self._engine(engine.destroy, self._client, ref)
            except Exception as exc:
                self._engine_failed(exc)
                verified = False
        await box.endpoint.close()
        if verified:
            self._stale.discard(box)
            box.note = None
            if self.uids is not None:
                self.uids.release(box.name)  # a warm container's own uid (no-op for others)
        else:
            self._stale.add(box)  # removed (and its uid freed) when the engine is back
            if self._engine_error:
                box.note = ("the Docker engine is unreachable; the container is removed when "
                            "it is back")
        return verified

    async def _destroy_shielded(self, box: Box) -> bool:
        task = asyncio.ensure_future(self._destroy(box))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            await task
            raise

    # ------------------------------------------------------------ warm pool

    async def _refill_loop(self) -> None:
        sem = asyncio.Semaphore(POOL_PARALLEL_STARTS)
        backoff = 0.5
        pending: set[asyncio.Task[None]] = set()

        async def fill_one(image: str) -> None:
            nonlocal backoff
            async with sem:
                try:
                    box = await self._new_box(image=image, shape=self._pool_shape[image],
                                              role="pool", invocation="pool", workspace=None)
                except Exception as exc:
                    log.warning("warm pool: cannot start a container: %s", exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 30)
                    return
                finally:
                    self._filling[image] -= 1
                backoff = 0.5
                if self._closing:
                    await self._destroy(box)
                    return
                self._pool[image].append(box)
                self._refill.set()

        while not self._closing:
            await self._refill.wait()
            self._refill.clear()
            if not self._available[0]:  # the engine watch sets _refill when it is back
                continue
            target = self._pool_target()
            for image, boxes in self._pool.items():
                for box in [b for b in boxes if b.dead]:
                    boxes.remove(box)
                missing = target - len(boxes) - self._filling.get(image, 0)
                for _ in range(max(missing, 0)):
                    self._filling[image] = self._filling.get(image, 0) + 1
                    task = asyncio.create_task(fill_one(image))
                    pending.add(task)
                    task.add_done_callback(pending.discard)

    def _take_from_pool(self, image: str) -> Box | None:
        boxes = self._pool.get(image)
        if not boxes:
            return None
        for box in [b for b in boxes if b.dead or _runner_lost(b)]:  # never hand out those
            boxes.remove(box)
            if not box.dead:
                task = asyncio.ensure_future(self._destroy(box))
                self._reaping.add(task)
                task.add_done_callback(self._reaping.discard)
        # prefer a container whose runner is already connected
        choice = next((b for b in boxes if b.endpoint.ready and not b.dead), None)
        if choice is None:
            choice = next((b for b in boxes if not b.dead), None)
        if choice is not None:
            boxes.remove(choice)
        if not boxes:  # otherwise the refill waits until this call is over (see _run_oneshot)
            self._refill.set()
        return choice

    # ------------------------------------------------------------ run

    async def run(self, invocation: Invocation, limits: Limits, deadline: float) -> Result:
        """Execute one call (see the module docstring)."""
        started = time.monotonic()
        request = self._request(invocation, limits)
        if isinstance(request, Result):
            return request
        image = self._image_for(invocation)
        shape = engine.Shape.of(limits)
        try:
            if invocation.session is not None:
                return await self._run_session(invocation, limits, deadline, request, image,
                                               shape, started)
            return await self._run_oneshot(invocation, limits, deadline, request, image, shape,
                                           started)
        except (docker.errors.DockerException, requests.exceptions.RequestException,
                BackendUnavailable) as exc:
            # e.g. an image or network named by a policy does not exist, or the engine went
            # away; whatever was created has been removed (or is, once the engine is back)
            detail = getattr(exc, "explanation", None) or str(exc)
            message = f"the sandbox container could not be started: {detail}"
            cleanup = Cleanup(verified=True)
            if not isinstance(exc, docker.errors.DockerException):  # no answer at all
                self._engine_failed(exc)
                message = f"the Docker engine went away: {detail}"
                cleanup = Cleanup(verified=not self._stale, detail=None if not self._stale else
                                  "the Docker engine is unreachable; containers of the call "
                                  "are removed when it is back")
            return Result.build(invocation, self.name, Reason.exited, status=Status.error,
                                limits=limits, started=started, cleanup=cleanup,
                                message=message)

    def _request(self, invocation: Invocation, limits: Limits) -> dict[str, Any] | Result:
        env = {"PATH": engine.CHILD_PATH, "HOME": "/workspace", "LANG": "C.UTF-8",
               "TMPDIR": "/tmp", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
        base = {"id": invocation.id, "env": env, "cwd": "/workspace",
                "output_bytes": limits.output_bytes}
        if invocation.kind is ToolKind.command:
            plan = invocation.plan
            if plan is None:
                if not invocation.argv:
                    return self._rejected(invocation, limits, "no command to run (empty argv)")
                plan = Plan.single([str(a) for a in invocation.argv])
            # the checked structure itself: the runner executes it, no shell is involved
            return {**base, "kind": "plan", "plan": plan.model_dump(mode="json")}
        if invocation.kind is ToolKind.python:
            code = invocation.arguments.get("code")
            if not isinstance(code, str) or not code.strip():
                return self._rejected(invocation, limits, "argument 'code' must be non-empty")
            if len(code.encode()) > MAX_CODE_BYTES:
                return self._rejected(invocation, limits, "the code is too large")
            return {**base, "kind": "python", "code": code,
                    "imports_allow": list(invocation.imports_allow),
                    "imports_deny": list(invocation.imports_deny)}
        return self._rejected(invocation, limits,
                              f"the container backend does not run {invocation.kind} tools")

    def _rejected(self, invocation: Invocation, limits: Limits, message: str) -> Result:
        return Result.build(invocation, self.name, Reason.policy, status=Status.rejected,
                            limits=limits, cleanup=Cleanup(verified=True), message=message)

    async def _run_oneshot(self, invocation: Invocation, limits: Limits, deadline: float,
                           request: dict[str, Any], image: str, shape: engine.Shape,
                           started: float) -> Result:
        try:
            return await self._oneshot(invocation, limits, deadline, request, image, shape,
                                       started)
        finally:
            # refill once this call's container is gone: a container start competes with the
            # call for the engine and the CPU, so starting it afterwards keeps latency low
            self._refill.set()

    async def _oneshot(self, invocation: Invocation, limits: Limits, deadline: float,
                       request: dict[str, Any], image: str, shape: engine.Shape,
                       started: float) -> Result:
        box: Box | None = None
        try:
            own_tmpfs = _is_empty_dir(invocation.workspace)
            poolable = invocation.network is None and own_tmpfs
            if poolable:
                if image not in self._pool:
                    self._pool[image] = deque()
                    self._pool_shape[image] = shape
                    self._refill.set()
                if invocation.client != PROBE_CLIENT:  # refill with the shape calls use
                    self._pool_shape[image] = shape
                box = self._take_from_pool(image)
            if box is None:
                made, box = await within(
                    self._new_box(image=image, shape=shape, role="oneshot",
                                  invocation=invocation.id,
                                  workspace=None if own_tmpfs else invocation.workspace,
                                  network=invocation.network, uid=invocation.uid),
                    deadline - time.monotonic())
                if not made:  # _new_box removed what it had started
                    raise TimeoutError
            if box.shape != shape:
                await self._engine(engine.update_shape, self.client, box.cid or box.name, shape)
                box.shape = shape
            outcome = await self._exchange(box, request, limits, deadline)
        except asyncio.CancelledError as exc:
            if box is not None:
                verified = await self._destroy_shielded(box)
                raise CancelledAfterCleanup(verified, _gone(box, verified)) from None
            if isinstance(exc, CancelledAfterCleanup):
                raise
            raise CancelledAfterCleanup(True, "no container was started") from None
        except TimeoutError:
            verified = await self._destroy_shielded(box) if box is not None else True
            return self._timeout(invocation, limits, started, verified, _gone(box, verified))
        except BaseException:
            if box is not None:
                await self._destroy_shielded(box)
            raise
        oom = outcome.needs_oom_check and await self._engine(engine.oom_killed, self.client,
                                                             box.cid or box.name)
        verified = await self._destroy_shielded(box)
        return self._result(invocation, limits, outcome, started, verified, oom=oom,
                            detail=_gone(box, verified))

    async def _session_box(self, key: tuple[str, str, str], invocation: Invocation,
                           image: str, shape: engine.Shape, deadline: float) -> Box:
        lock = self._session_locks.setdefault(key, asyncio.Lock())
        async with lock:
            box = self._sessions.get(key)
            if box is not None and not box.dead:
                return box
            made, box = await within(
                self._new_box(image=image, shape=shape, role="session",
                              invocation=invocation.id, workspace=invocation.workspace,
                              network=invocation.network, session=invocation.session,
                              uid=invocation.uid),
                deadline - time.monotonic())
            if not made:
                raise TimeoutError
            self._sessions[key] = box
            return box

    async def _run_session(self, invocation: Invocation, limits: Limits, deadline: float,
                           request: dict[str, Any], image: str, shape: engine.Shape,
                           started: float) -> Result:
        assert invocation.session is not None
        key = (invocation.client, invocation.session, image)
        box: Box | None = None
        try:
            box = await self._session_box(key, invocation, image, shape, deadline)
            if box.shape != shape:
                await self._engine(engine.update_shape, self.client, box.cid or box.name, shape)
                box.shape = shape
            outcome = await self._exchange(box, request, limits, deadline)
        except asyncio.CancelledError as exc:
            if box is not None:
                verified = await self._drop_session_box(key, box)
                raise CancelledAfterCleanup(verified, _gone(box, verified)) from None
            if isinstance(exc, CancelledAfterCleanup):
                raise
            raise CancelledAfterCleanup(True, "no container was started") from None
        except TimeoutError:
            verified = await self._drop_session_box(key, box) if box is not None else True
            return self._timeout(invocation, limits, started, verified, _gone(box, verified))
        except BaseException:
            if box is not None:
                await self._drop_session_box(key, box)
            raise
        if outcome.lost and box.dead:
            # another call of this session hit a limit and its container was removed
            outcome.lost = None
            outcome.superseded = True
        if outcome.clean:
            verified = bool(outcome.record.get("group_gone", True))
            return self._result(invocation, limits, outcome, started, verified, oom=False,
                                detail="session container kept; the call's processes are gone"
                                if verified else "processes of the call may be left")
        oom = outcome.needs_oom_check and await self._engine(engine.oom_killed, self.client,
                                                             box.cid or box.name)
        verified = await self._drop_session_box(key, box)
        return self._result(invocation, limits, outcome, started, verified, oom=oom,
                            detail=_gone(box, verified) + " (the session gets a new one)")

    async def _drop_session_box(self, key: tuple[str, str, str], box: Box) -> bool:
        if self._sessions.get(key) is box:
            del self._sessions[key]
        return await self._destroy_shielded(box)

    async def _exchange(self, box: Box, request: dict[str, Any], limits: Limits,
                        deadline: float) -> _Outcome:
        """Run one request on ``box`` within the deadline (raises TimeoutError).

        The deadline is enforced with ``asyncio.wait`` around a task, never with nested
        ``wait_for``/``timeout`` (Python 3.11's ``wait_for`` can swallow a cancellation that
        races with completion, which would let a call outlive its deadline).
        """
        out = CallOutput()
        if deadline - time.monotonic() <= 0:
            raise TimeoutError
        task = asyncio.ensure_future(self._exchange_body(box, request, limits, out))
        finished, result = await within(task, deadline - time.monotonic())
        if not finished:
            raise TimeoutError
        return result

    async def _exchange_body(self, box: Box, request: dict[str, Any], limits: Limits,
                             out: CallOutput) -> _Outcome:
        endpoint = box.endpoint
        if not endpoint.settled.is_set():
            started, _ = await within(endpoint.settled.wait(), RUNNER_CONNECT_S)
            if not started:
                return _Outcome(out, (
                    f"the sandbox runner of image {box.image} did not start within "
                    f"{RUNNER_CONNECT_S:g} s; images must be built FROM the sandboxd image "
                    "(see images/)"))
        if endpoint.channel is None:
            return _Outcome(out, f"no sandbox runner channel: {endpoint.failure}")
        try:
            await endpoint.channel.call(request, limits.output_bytes, out)
        except RunnerLost as exc:
            return _Outcome(out, str(exc))
        return _Outcome(out, None)

    # ------------------------------------------------------------ results

    def _timeout(self, invocation: Invocation, limits: Limits, started: float,
                 verified: bool, detail: str) -> Result:
        return Result.build(invocation, self.name, Reason.wall_timeout, limits=limits,
                            started=started, cleanup=Cleanup(verified=verified, detail=detail))

    def _result(self, invocation: Invocation, limits: Limits, outcome: _Outcome,
                started: float, verified: bool, *, oom: bool, detail: str | None) -> Result:
        out, rec = outcome.output, outcome.record
        exit_code = rec.get("exit_code")
        sig = rec.get("signal")
        message = None
        if outcome.superseded:
            reason = Reason.cancelled
            message = ("the session's container was removed while this call ran, because "
                       "another call of the session hit a limit; run it again")
        elif rec.get("oom") or oom:
            reason = Reason.memory_limit  # the message: the one table (Result.build)
        elif out.over_limit or rec.get("output_limit"):
            reason = Reason.output_limit
        elif rec.get("pids_limit"):
            reason = Reason.pids_limit
        elif outcome.lost:
            reason = Reason.exited
            message = outcome.lost
            if self._engine_error is not None:
                message = f"the Docker engine went away during the call ({outcome.lost})"
        elif rec.get("error"):
            reason = Reason.exited
            message = str(rec["error"])
        else:
            reason = Reason.exited
        status = status_for(reason, exit_code)
        if (outcome.lost or rec.get("error")) and not outcome.superseded:
            status = Status.error
        truncated = Truncated()
        if reason is Reason.output_limit:
            truncated = Truncated(stdout=out.last_stream == "stdout",
                                  stderr=out.last_stream == "stderr")
        return Result.build(
            invocation, self.name, reason, status=status, exit_code=exit_code, signal=sig,
            stdout=out.stdout.decode("utf-8", errors="replace"),
            stderr=out.stderr.decode("utf-8", errors="replace"),
            truncated=truncated,
            value=rec.get("value") if rec.get("has_value") else None,
            resources=Resources(wall_ms=int((time.monotonic() - started) * 1000),
                                cpu_ms=int(rec.get("cpu_ms") or 0),
                                peak_memory_bytes=int(rec.get("peak_memory_bytes") or 0)),
            limits=limits,
            cleanup=Cleanup(verified=verified, detail=detail),
            message=message,
        )

    # ------------------------------------------------------------ sessions

    async def close_session(self, session_id: str) -> None:
        """Remove the session's container(s). Idempotent."""
        keys = [k for k in self._sessions if k[1] == session_id]
        await asyncio.gather(*(self._drop_session_box(k, self._sessions[k]) for k in keys),
                             return_exceptions=True)
        for key in keys:
            self._session_locks.pop(key, None)

    # ------------------------------------------------------------ readiness

    async def probe(self) -> ProbeReport:
        """Prove confinement by running probes in real containers (one-shot path)."""
        ok, why = self.availability()
        if not ok:
            return ProbeReport(backend=self.name, ok=False, detail=why or "unavailable")
        cached = self._probe_cache
        if cached is not None and time.monotonic() - cached[0] < PROBE_CACHE_S:
            return cached[1]
        report = await self._probe()
        self._probe_cache = (time.monotonic(), report) if report.ok else None
        return report

    async def _probe(self) -> ProbeReport:
        checks: list[ProbeCheck] = []
        workspace = Path(tempfile.mkdtemp(prefix="probe-", dir=self.settings.state_dir))
        try:
            # the daemon's own probe code: every import admitted (the runner's rule is default
            # deny, as for a policy's call)
            inv = Invocation(tool="python", kind=ToolKind.python, client=PROBE_CLIENT,
                             workspace=workspace, arguments={"code": PROBE_CODE},
                             imports_allow=["*"])
            limits = Limits(timeout_s=30)
            res = await self.run(inv, limits, time.monotonic() + 30)
            facts = res.value if isinstance(res.value, dict) else {}
            if not facts:
                detail = f"probe failed: {res.status} {res.message or ''} {res.stderr[-300:]}"
                return ProbeReport(backend=self.name, ok=False, detail=detail)
            uid = facts.get("uid")
            own = (self.uids.contains(uid) if self.uids is not None and isinstance(uid, int)
                   else uid == self.settings.sandbox_uid)
            checks.append(ProbeCheck(name="unprivileged",
                                     ok=bool(own) and uid != 0 and facts.get("cap_eff") == 0,
                                     detail=f"uid={facts.get('uid')} "
                                            f"CapEff={facts.get('cap_eff')}"))
            checks.append(ProbeCheck(name="socket_blocked", ok=bool(facts.get("net_blocked")),
                                     detail=str(facts.get("net_detail"))))
            checks.append(ProbeCheck(name="write_outside_blocked",
                                     ok=bool(facts.get("write_blocked")),
                                     detail=str(facts.get("write_detail"))))
            checks.append(ProbeCheck(name="seccomp",
                                     ok=facts.get("seccomp") == 2
                                     and bool(facts.get("unshare_blocked")),
                                     detail=f"Seccomp={facts.get('seccomp')} unshare blocked="
                                            f"{facts.get('unshare_blocked')}"))
            checks.append(ProbeCheck(name="no_new_privs", ok=facts.get("no_new_privs") == 1,
                                     detail=f"NoNewPrivs={facts.get('no_new_privs')}"))
            mem_inv = Invocation(tool="python", kind=ToolKind.python, client=PROBE_CLIENT,
                                 workspace=workspace, imports_allow=["*"],
                                 arguments={"code": "x = bytearray(96 * 1024 * 1024)\n"
                                                    "x[::4096] = b'x' * len(x[::4096])\n"})
            mem = await self.run(mem_inv, Limits(timeout_s=30, memory_bytes=48 * 1024 * 1024),
                                 time.monotonic() + 30)
            checks.append(ProbeCheck(
                name="memory_limit", ok=mem.termination.reason is Reason.memory_limit,
                detail=f"96 MiB under a 48 MiB limit -> {mem.termination.reason.value}"))
            checks.append(ProbeCheck(name="cleanup", ok=res.cleanup.verified
                                     and mem.cleanup.verified,
                                     detail="probe containers removed"))
        finally:
            await asyncio.to_thread(fstree.remove_tree_quietly, workspace)
        return ProbeReport(backend=self.name, ok=all(c.ok for c in checks), checks=checks)


@dataclass
class _Outcome:
    output: CallOutput
    lost: str | None
    superseded: bool = False

    @property
    def record(self) -> dict[str, Any]:
        return self.output.exit or {}

    @property
    def clean(self) -> bool:
        """The call ended by itself, within every limit: its container may be reused."""
        rec = self.record
        return (self.output.exit is not None and not self.lost and not self.superseded
                and not self.output.over_limit
                and not rec.get("oom") and not rec.get("pids_limit")
                and not rec.get("output_limit") and not rec.get("error"))

    @property
    def needs_oom_check(self) -> bool:
        """Ask the engine about OOM when the process died by SIGKILL or the runner vanished."""
        rec = self.record
        return not rec.get("oom") and (self.lost is not None or rec.get("signal") == 9)


def _gone(box: Box | None, verified: bool) -> str:
    if box is None:
        return "no container was started"
    if verified:
        return f"container {box.name} removed"
    return (f"the engine did not confirm the removal of container {box.name}"
            + (f": {box.note}" if box.note else ""))


def _runner_lost(box: Box) -> bool:
    """The container's runner channel broke (the container stopped) or never came up."""
    channel = box.endpoint.channel
    return (channel is not None and channel.broken is not None) or box.endpoint.failure is not None


def _is_empty_dir(path: Path) -> bool:
    try:
        with os.scandir(path) as it:
            return next(it, None) is None
    except OSError:
        return False


PROBE_CODE = r"""
import ctypes, os, socket
facts = {"uid": os.getuid()}
with open("/proc/self/status") as fh:
    status = dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)
facts["cap_eff"] = int(status.get("CapEff", "-1"), 16)
facts["seccomp"] = int(status.get("Seccomp", "0").strip())
facts["no_new_privs"] = int(status.get("NoNewPrivs", "0").strip())
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect(("1.1.1.1", 53))
    facts["net_blocked"], facts["net_detail"] = False, "connected to 1.1.1.1:53"
except OSError as exc:
    facts["net_blocked"], facts["net_detail"] = True, f"connect: {exc}"
blocked = []
for path in ("/probe", "/etc/probe", "/usr/probe", "/run/sandboxd/probe"):
    try:
        with open(path, "w") as fh:
            fh.write("x")
        blocked.append(False)
    except OSError:
        blocked.append(True)
facts["write_blocked"] = all(blocked)
facts["write_detail"] = "writes to /, /etc, /usr, /run/sandboxd refused" if all(blocked) else (
    f"some writes succeeded: {blocked}")
libc = ctypes.CDLL(None, use_errno=True)
facts["unshare_blocked"] = libc.unshare(0x10000000) != 0
facts
"""
