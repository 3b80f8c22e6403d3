"""``RestrictedBackend``: the daemon side of the restricted python backend.

Per call: the backend takes one of the zygote's standby workers (a prepared, never-used
process it holds a socket and a pidfd for), writes the request to the worker's socket, and
reads output frames back until EOF, the wall deadline (then the worker is killed through its
pidfd: ``wall_timeout``), an output overflow (``output_limit``) or a protocol violation (the
worker's writes are an attacker's: :mod:`.frames` bounds them; the worker is killed and the
call fails with ``error``). It then waits for the
zygote's exit report (the worker has been reaped, its cgroup's peak memory and OOM count read,
the cgroup found empty), maps what happened to the result, and checks in /proc that the
worker is gone before setting ``cleanup.verified``. On cancellation it kills the worker, waits
for that report, then re-raises. If the zygote dies, in-flight calls end with status ``error``
(their workers die with it and are killed through their pidfds; their cgroups are removed
here) and the next call starts a new zygote.

Mapping (see :mod:`sandboxd.models`): the worker's final report gives ``ok``/``error``
(exception, compile refusal, ``SystemExit(n)``), ``memory_limit`` (``MemoryError`` from
RLIMIT_AS) or ``output_limit``; a worker without a report was killed: by us at the deadline
(``wall_timeout``), by the cgroup OOM killer (``memory_limit``), by RLIMIT_CPU
(``SIGXCPU``/``SIGKILL`` with its CPU time at the limit: ``cpu_limit``), else it crashed
(``exited`` with the signal, status ``error``). ``resources.wall_ms`` is measured here,
``cpu_ms`` comes from ``wait4`` and ``peak_memory_bytes`` from the cgroup (else max RSS).

A ``python`` call that names a session runs instead in that session's kernel: a standby
worker kept alive for the session, its namespace persisting between calls (:mod:`.kernel`:
per-call wall and CPU limits, the session's memory and pids, lost on any limit or crash).

The pieces: :mod:`.zygote_client` (the zygote's process and sockets, standby workers handed
over), :mod:`.standby` (one call on a standby worker), :mod:`.kernel` (session kernels),
:mod:`.outcome` (the Result and the cleanup proof), :mod:`.probe` (the readiness self-test);
this class sequences them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Set as AbstractSet
from typing import Any

from sandboxd.backends.base import Backend, KernelState
from sandboxd.backends.call import BackendCall
from sandboxd.backends.capabilities import Hibernating, KernelCarrier, KernelHost
from sandboxd.backends.restricted import carry, health, landlock, namespaces, outcome, standby
from sandboxd.backends.restricted.cgroups import CgroupLayout
from sandboxd.backends.restricted.config import RestrictedConfig
from sandboxd.backends.restricted.kernel import KernelPool
from sandboxd.backends.restricted.probe import PROBE_PREFIX, run_probe
from sandboxd.backends.restricted.worker_call import WorkerCall
from sandboxd.backends.restricted.zygote_client import (
    StandbyWorker,
    ZygoteDied,
    ZygoteHandle,
    spawn_zygote,
)
from sandboxd.config import Settings
from sandboxd.host.uids import UidPool
from sandboxd.models import (
    Cleanup,
    Invocation,
    ProbeReport,
    Reason,
    Result,
    Status,
    ToolKind,
)
from sandboxd.protocol.call import WorkerReport
from sandboxd.util.deadline import stop_task
from sandboxd.util.setview import DisjointUnion
from sandboxd.workspaces import fstree

log = logging.getLogger("sandboxd.restricted")


class RestrictedBackend(Backend, KernelHost, KernelCarrier, Hibernating):
    """RestrictedPython in a confined, pre-forked worker process (see the package docs)."""

    name = outcome.BACKEND_NAME

    def __init__(self, config: RestrictedConfig, uids: UidPool | None = None) -> None:
        self.config = config
        self.root = os.geteuid() == 0
        # per-sandbox identities (shared with the sessions and the other backends)
        self.uids = uids if uids is not None else UidPool.for_range(
            config.sandbox_uid_first, config.sandbox_uid_count)
        self.layout = CgroupLayout()
        # PID/IPC namespaces for the workers: as root, where this process may create them
        self.no_namespaces: str | None = None if self.root else "daemon not root"
        self._zygote: ZygoteHandle | None = None
        self._start_lock: asyncio.Lock | None = None
        self._unavailable: str | None = "not started"
        self._closed = False
        self.restarts = 0
        self._health: asyncio.Task[None] | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self.kernels = KernelPool(self, carry.snapshot_locked)  # session kernels (see .kernel)

    @classmethod
    def from_settings(cls, settings: Settings, uids: UidPool | None = None) -> RestrictedBackend:
        """The backend as the daemon builds it from its settings."""
        return cls(RestrictedConfig.from_settings(settings), uids)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Detect cgroups, sweep leftovers of a crashed daemon, start the zygote."""
        if not self.config.enabled:
            self._unavailable = "the restricted backend is disabled (restricted_enabled=false)"
            return
        self._start_lock = asyncio.Lock()
        self.layout = await asyncio.to_thread(
            CgroupLayout.detect, self.config.cgroup_root, self.config.instance_name
        )
        if self.layout.version:
            await asyncio.to_thread(self.layout.sweep)
        if self.root:
            self.no_namespaces = await asyncio.to_thread(namespaces.unavailable)
            if self.no_namespaces:
                log.warning("restricted: no PID/IPC namespaces for the workers: %s; they are "
                            "separated by uid and seccomp only", self.no_namespaces)
        for leftover in self.config.state_dir.glob(f"{PROBE_PREFIX}*"):
            await asyncio.to_thread(fstree.remove_tree_quietly, leftover)
        self._closed = False
        try:
            await self._ensure_zygote()
        except Exception as exc:
            self._unavailable = f"could not start the sandbox zygote: {exc}"
            log.error("restricted: %s", self._unavailable)
            return
        self._unavailable = None
        self._health = asyncio.create_task(self._health_loop(), name="restricted-health")
        self.kernels.hibernation.start()
        log.info(
            "restricted: zygote pid %d, %s, landlock ABI %d, %s",
            self._zygote.pid if self._zygote else -1,
            self.layout.detail or "no cgroups",
            landlock.landlock_abi(),
            f"each worker runs as its own uid of {self.uids.first}..."
            f"{self.uids.first + self.uids.count - 1} in a chroot"
            + ("" if self.no_namespaces else " and PID/IPC namespaces")
            if self.uids is not None
            else "daemon not root: workers keep its uid (Landlock is the filesystem boundary)",
        )

    @property
    def namespaces(self) -> bool:
        """Workers get PID and IPC namespaces of their own."""
        return self.root and self.no_namespaces is None

    async def close(self) -> None:
        """End the session kernels, stop the zygote (it kills its workers) and remove our
        cgroups."""
        self._closed = True
        await self.kernels.close()
        for task in [self._health, *self._retiring]:
            await stop_task(task)
        z, self._zygote = self._zygote, None
        if z is not None:
            await z.close()
        if self.layout.version:
            await asyncio.to_thread(self.layout.sweep)
            await asyncio.to_thread(self.layout.remove_bases)
        self._unavailable = "closed"

    def availability(self) -> tuple[bool, str | None]:
        if self._unavailable is not None:
            return False, self._unavailable
        return True, None

    async def close_session(self, session_id: str) -> None:
        """End the session's kernel, if it has one (verified gone)."""
        await self.kernels.end(session_id, "the session was closed", forget=True)

    def kernel_sessions(self) -> AbstractSet[str]:
        """Sessions with a live kernel, in memory or hibernated (see .hibernation): a view
        of the two sets, which never share a session."""
        return DisjointUnion(self.kernels.live(), self.kernels.hibernation.sessions())

    def hibernated_sessions(self) -> AbstractSet[str]:
        """Sessions whose kernel sleeps on disk (see .hibernation)."""
        return self.kernels.hibernation.sessions()

    def interrupt_kernel(self, session_id: str) -> bool:
        """Interrupt the call in the session's kernel (see :meth:`.KernelPool.interrupt`)."""
        return self.kernels.interrupt(session_id)

    async def snapshot_kernel(self, session_id: str, limit: int,
                              deadline: float) -> KernelState | None:
        """The session kernel's pickled state (see :mod:`.carry`)."""
        return await carry.snapshot(self.kernels, session_id, limit, deadline)

    def seed_kernel(self, session_id: str, state: bytes) -> None:
        """The state the session's first kernel restores (see :meth:`.KernelPool.seed`)."""
        self.kernels.seed(session_id, state)

    async def restart_kernel(self, session_id: str) -> bool:
        """End the session's kernel; its next call starts a fresh one."""
        return await self.kernels.end(session_id, "restarted")

    @property
    def zygote(self) -> ZygoteHandle | None:
        """The current zygote (None before the first start and while it is replaced)."""
        return self._zygote

    def _zygote_config(self) -> dict[str, Any]:
        """What a new zygote is told (besides its sockets): identities, chroot, namespaces,
        standby count and the cgroup layout."""
        return {
            # a worker runs as its call's uid (= gid), which must lie in this range
            "uid_range": [self.uids.first, self.uids.count] if self.uids else None,
            "chroot": self.root,
            "namespaces": self.namespaces,
            "standby": self.config.standby_workers,
            "cgroup": {
                "version": self.layout.version,
                "bases": {k: str(v) for k, v in self.layout.bases.items()},
            },
        }

    async def _ensure_zygote(self) -> ZygoteHandle:
        z = self._zygote
        if z is not None and z.alive:
            return z
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            z = self._zygote
            if z is not None and z.alive:
                return z
            if self._closed:
                raise ZygoteDied("the restricted backend is closed")
            if z is not None:
                # nobody else may take this dead zygote for a hung one while it is replaced
                self._zygote = None
                self.restarts += 1
                # workers of the dead zygote died with it (parent-death signal); their cgroups
                # have nobody left to remove them
                orphans = [w.cgroup for w in z.workers.values()]
                if self.layout.version and orphans:
                    await asyncio.to_thread(lambda: [self.layout.remove(c) for c in orphans])
                log.warning(
                    "restricted: the sandbox zygote (pid %d) died; starting a new one", z.pid
                )
                await z.close()
            self._zygote = await spawn_zygote(self._zygote_config())
            return self._zygote

    async def _health_loop(self) -> None:
        """Forever: ping the zygote; one that does not answer in time is replaced."""
        while not self._closed:
            await asyncio.sleep(health.HEALTH_INTERVAL_S)
            z = self._zygote
            try:
                if z is None or not z.alive:
                    await self._ensure_zygote()
                elif not await z.ping(health.PING_TIMEOUT_S):
                    await self.replace_zygote(z)
            except Exception as exc:  # keep checking: a failed spawn is retried
                log.error("restricted: zygote health check: %s", exc)

    async def replace_zygote(self, z: ZygoteHandle) -> None:
        """Retire a zygote that does not answer and start a new one at once; the old one is
        killed when its in-flight calls are over (they end by their deadlines)."""
        if self._zygote is not z or z.hung.is_set() or not z.alive:
            return  # already replaced, or dead (that is _ensure_zygote's to handle)
        log.warning("restricted: the sandbox zygote (pid %d) did not answer a health ping "
                    "within %g s; replacing it", z.pid, health.PING_TIMEOUT_S)
        z.retire()
        self._zygote = None
        self.restarts += 1
        task = asyncio.create_task(self._retire(z), name=f"retire-zygote-{z.pid}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        await self._ensure_zygote()

    async def _retire(self, z: ZygoteHandle) -> None:
        try:
            while z.in_use and not self._closed:
                await asyncio.sleep(0.1)
        finally:
            z.kill()
            await asyncio.to_thread(z.proc.wait)
            orphans = [w.cgroup for w in z.workers.values()]
            z.died()
            with contextlib.suppress(OSError):
                z.evt.close()
                z.req.close()
            if self.layout.version and orphans:
                await asyncio.to_thread(lambda: [self.layout.remove(c) for c in orphans])

    # ------------------------------------------------------------ calls

    async def run(self, invocation: Invocation, deadline: float) -> Result:
        """Run one python invocation: in its session's kernel when it names a session
        (:mod:`.kernel`), else in a fresh confined worker."""
        call = BackendCall(invocation, deadline)
        code = invocation.arguments.get("code")
        refused = self._refusal(call, code)
        if refused is not None:
            return refused
        assert isinstance(code, str)  # else refused
        if invocation.session is not None:
            return await self.kernels.run(call, code)
        result, _report = await self.execute(WorkerCall(call, standby.request(call, code)))
        return result

    def _refusal(self, call: BackendCall, code: object) -> Result | None:
        """The result of a call this backend does not run: not python, no code, or the
        sandbox unavailable."""
        kind = call.invocation.plan.kind
        if kind is not ToolKind.python:
            return outcome.result(call, Status.rejected, Reason.policy,
                                  cleanup=Cleanup(verified=True),
                                  message=f"the restricted backend only runs python code, "
                                  f"not {kind.value}")
        if not isinstance(code, str):
            return outcome.result(call, Status.rejected, Reason.policy,
                                  cleanup=Cleanup(verified=True),
                                  message="argument 'code' must be a string")
        return self._unavailable_result(call)

    def _unavailable_result(self, call: BackendCall) -> Result | None:
        """The result of a call while the sandbox is unavailable (not started, disabled),
        None when it is available."""
        if self._start_lock is not None and self.config.enabled:
            return None
        return outcome.result(call, Status.error, Reason.exited, cleanup=Cleanup(verified=True),
                              message=f"sandbox unavailable: {self._unavailable}")

    async def execute(self, wc: WorkerCall) -> tuple[Result, WorkerReport | None]:
        """Run the worker call ``wc``: take a standby worker, run the call on it, build the
        result. Returns the result and the worker's final report (None without one)."""
        unavailable = self._unavailable_result(wc.call)
        if unavailable is not None:
            return unavailable, None
        try:
            z, worker = await self.take_worker(wc.deadline)
        except (ZygoteDied, TimeoutError) as exc:
            status, reason = (
                (Status.timeout, Reason.wall_timeout)
                if isinstance(exc, TimeoutError)
                else (Status.error, Reason.exited)
            )
            return outcome.result(wc, status, reason, cleanup=Cleanup(verified=True),
                                  message=f"no sandbox worker: {exc}"), None
        seen = await standby.exchange(z, worker, wc, self.layout)
        return outcome.build_result(wc, seen, worker, z.pid), seen.reader.report

    async def take_worker(self, deadline: float) -> tuple[ZygoteHandle, StandbyWorker]:
        """A standby worker by ``deadline`` (``TimeoutError``), from a new zygote when the
        current one dies or is replaced meanwhile."""
        while True:
            try:
                z = await self._ensure_zygote()
            except Exception as exc:
                raise ZygoteDied(f"sandbox unavailable: {exc}") from exc
            try:
                return z, await z.take(deadline)
            except ZygoteDied:
                if self._closed or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.05)

    # ------------------------------------------------------------ readiness

    async def probe(self) -> ProbeReport:
        """Run trusted probes in fully confined workers (see :mod:`.probe`)."""
        return await run_probe(self)
