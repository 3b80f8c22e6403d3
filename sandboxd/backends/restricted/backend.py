"""``RestrictedBackend``: the daemon side of the restricted python backend.

Per call: the backend takes one of the zygote's standby workers (a prepared, never-used
process it holds a socket and a pidfd for), writes the request to the worker's socket, and
reads output frames back until EOF, the wall deadline (then the worker is killed through its
pidfd: ``wall_timeout``), an output overflow (``output_limit``) or a protocol violation (the
worker's writes are an attacker's: :mod:`.frames` bounds them; the worker is killed and the
call fails with ``error``). It then waits for the
zygote's exit report (the worker has been reaped, its cgroup's peak memory and OOM count read,
the cgroup found empty), maps what happened to the result, and checks with psutil that the
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
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

import sandboxd
from sandboxd import fstree
from sandboxd.backends.base import CancelledAfterCleanup
from sandboxd.backends.restricted import health, landlock, namespaces
from sandboxd.backends.restricted.cgroups import CgroupLayout
from sandboxd.backends.restricted.frames import FrameReader
from sandboxd.backends.restricted.zygote_protocol import CTRL, HEADER
from sandboxd.config import Settings
from sandboxd.deadline import within
from sandboxd.errors import SandboxdError
from sandboxd.models import (
    Cleanup,
    Invocation,
    Limits,
    ProbeCheck,
    ProbeReport,
    Reason,
    Resources,
    Result,
    Status,
    ToolKind,
    Truncated,
)
from sandboxd.rules import OutputBudget
from sandboxd.uids import UidPool

#: deadline of each self-test probe: a bound that only a hung worker reaches (a slow or
#: emulated host takes seconds to fill the 64 MiB the memory probe needs)
PROBE_DEADLINE_S = 60.0

log = logging.getLogger("sandboxd.restricted")
_PROBE_PREFIX = "restricted-probe-"

# The zygote imports only what workers need: the package __init__ files (pydantic models,
# asyncio, psutil...) are bypassed with bare package modules, which keeps the zygote's heap -
# and so the copy-on-write work of every worker - small.
_BOOT = (
    "import json, sys, types\n"
    "cfg = json.loads(sys.argv[1])\n"
    "for name, path in cfg['packages']:\n"
    "    mod = types.ModuleType(name)\n"
    "    mod.__path__ = [path]\n"
    "    sys.modules[name] = mod\n"
    "from sandboxd.backends.restricted.zygote import main\n"
    "main(cfg)\n"
)


def _bare_packages() -> list[tuple[str, str]]:
    pkg = Path(sandboxd.__file__).resolve().parent
    return [
        ("sandboxd", str(pkg)),
        ("sandboxd.backends", str(pkg / "backends")),
        ("sandboxd.backends.restricted", str(pkg / "backends" / "restricted")),
    ]


class ZygoteDied(SandboxdError, RuntimeError):
    """The zygote process went away while a call was in flight."""

    code = "zygote-died"


class _Standby:
    """A prepared worker the zygote handed over: its socket, pidfd and cgroup."""

    def __init__(
        self,
        pid: int,
        sock: socket.socket,
        pidfd: int | None,
        cgroup: str,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.pid = pid
        self.sock = sock
        self.pidfd = pidfd
        self.cgroup = cgroup
        self.exited: asyncio.Future[dict[str, Any]] = loop.create_future()

    def kill(self) -> bool:
        """SIGKILL through the pidfd (no pid-reuse race). False when it must go via the
        zygote (no pidfd)."""
        if self.pidfd is None:
            return False
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        return True

    def close(self) -> None:
        self.sock.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def fail(self, exc: BaseException) -> None:
        if not self.exited.done():
            self.exited.set_exception(exc)
            self.exited.exception()  # mark retrieved


class _ZygoteHandle:
    """A running zygote: process, sockets, standby workers and workers in use."""

    def __init__(
        self, proc: subprocess.Popen[bytes], req: socket.socket, evt: socket.socket
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.proc = proc
        self.pid = proc.pid
        self.req = req
        self.evt = evt
        self.workers: dict[int, _Standby] = {}  # every worker not yet reported as exited
        self.standby: collections.deque[_Standby] = collections.deque()
        self.standby_ready = asyncio.Event()
        self.ready: asyncio.Future[int] = self.loop.create_future()
        self.alive = True
        self.hung = asyncio.Event()  # failed a health ping: retired, no new calls
        self.in_use = 0  # calls holding one of its workers
        self._pongs: dict[int, asyncio.Future[None]] = {}
        self._ping_seq = 0
        self.loop.add_reader(evt.fileno(), self._on_events)
        self.reading = True

    async def ping(self, timeout: float) -> bool:
        """True when the zygote answers a ping within ``timeout`` seconds."""
        if not self.alive:
            return False
        self._ping_seq += 1
        seq = self._ping_seq
        pong = self._pongs[seq] = self.loop.create_future()
        self.send(b"p", seq)
        try:
            answered, _ = await within(pong, timeout)
            return answered
        finally:
            self._pongs.pop(seq, None)

    def retire(self) -> None:
        """No new calls from this zygote (it stopped answering)."""
        self.hung.set()
        self.standby_ready.set()

    def kill(self) -> None:
        """SIGKILL the zygote (its workers die with it: parent-death signal)."""
        with contextlib.suppress(OSError):
            self.proc.kill()

    def send(self, kind: bytes, pid: int, preset: tuple[int, float, int] = (0, 0.0, 0)) -> None:
        """A control message to the zygote (``CTRL``: ``t`` took a standby, with the limits
        to preset on the next one; ``k`` kill); non-blocking, seqpacket keeps it whole."""
        if not self.alive:
            return
        with contextlib.suppress(OSError, struct.error):
            self.req.send(CTRL.pack(kind, pid, *preset))

    async def take(self, deadline: float) -> _Standby:
        while True:
            if not self.alive:
                raise ZygoteDied("the sandbox zygote process died")
            if self.hung.is_set():
                raise ZygoteDied("the sandbox zygote stopped answering and is being replaced")
            while self.standby:
                worker = self.standby.popleft()
                if not worker.exited.done():
                    return worker
            self.standby_ready.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no sandbox worker became available before the deadline")
            ready, _ = await within(self.standby_ready.wait(), remaining)
            if not ready:
                raise TimeoutError("no sandbox worker became available before the deadline")

    def _on_events(self) -> None:
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.evt, 65536, 4)
            except BlockingIOError:
                return
            except OSError:
                data, fds = b"", []
            if not data:
                for fd in fds:
                    os.close(fd)
                self.died()
                return
            try:
                msg = json.loads(data)
            except ValueError:
                msg = {}
            self.dispatch(msg, list(fds))

    def dispatch(self, msg: dict[str, Any], fds: list[int]) -> None:
        kind = msg.get("t")
        if kind == "standby" and fds:
            sock = socket.socket(fileno=fds[0])
            sock.setblocking(False)
            pidfd = fds[1] if len(fds) > 1 else None
            for extra in fds[2:]:
                os.close(extra)
            worker = _Standby(int(msg["pid"]), sock, pidfd, str(msg["cgroup"]), self.loop)
            self.workers[worker.pid] = worker
            self.standby.append(worker)
            self.standby_ready.set()
            return
        for fd in fds:
            os.close(fd)
        if kind == "pong":
            pong = self._pongs.get(int(msg.get("seq", -1)))
            if pong is not None and not pong.done():
                pong.set_result(None)
        elif kind == "ready":
            if not self.ready.done():
                self.ready.set_result(int(msg["pid"]))
        elif kind == "exit":
            worker = self.workers.pop(int(msg.get("pid", -1)), None)
            if worker is not None:
                if not worker.exited.done():
                    worker.exited.set_result(msg)
                if worker in self.standby:  # died while on standby
                    self.standby.remove(worker)
                    worker.close()

    def died(self) -> None:
        if self.reading:
            self.loop.remove_reader(self.evt.fileno())
            self.reading = False
        self.alive = False
        self.standby_ready.set()
        if not self.ready.done():
            self.ready.set_exception(ZygoteDied("the zygote exited during start-up"))
            self.ready.exception()
        for worker in list(self.workers.values()):
            worker.fail(ZygoteDied("the sandbox zygote process died"))
        while self.standby:
            self.standby.popleft().close()
        if self.proc.poll() is None:  # reap it once it is gone (no zombie left behind)
            self.loop.run_in_executor(None, self.proc.wait)

    async def close(self) -> None:
        self.alive = False
        with contextlib.suppress(OSError):
            self.req.close()
        exited, _ = await within(asyncio.to_thread(self.proc.wait), 3)
        if not exited:
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait)
        self.died()
        with contextlib.suppress(OSError):
            self.evt.close()


class RestrictedBackend:
    """RestrictedPython in a confined, pre-forked worker process (see the package docs)."""

    name = "restricted"

    def __init__(self, settings: Settings, uids: UidPool | None = None) -> None:
        self.settings = settings
        self.root = os.geteuid() == 0
        # per-sandbox identities (shared with the sessions and the other backends)
        self.uids = uids if uids is not None else UidPool.from_settings(settings)
        self.layout = CgroupLayout()
        # PID/IPC namespaces for the workers: as root, where this process may create them
        self.no_namespaces: str | None = None if self.root else "daemon not root"
        self._zygote: _ZygoteHandle | None = None
        self._start_lock: asyncio.Lock | None = None
        self._unavailable: str | None = "not started"
        self._closed = False
        self.restarts = 0
        self._health: asyncio.Task[None] | None = None
        self._retiring: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Detect cgroups, sweep leftovers of a crashed daemon, start the zygote."""
        if not self.settings.restricted_enabled:
            self._unavailable = "the restricted backend is disabled (restricted_enabled=false)"
            return
        self._start_lock = asyncio.Lock()
        self.layout = await asyncio.to_thread(
            CgroupLayout.detect, self.settings.cgroup_root, self.settings.instance_name
        )
        if self.layout.version:
            await asyncio.to_thread(self.layout.sweep)
        if self.root:
            self.no_namespaces = await asyncio.to_thread(namespaces.unavailable)
            if self.no_namespaces:
                log.warning("restricted: no PID/IPC namespaces for the workers: %s; they are "
                            "separated by uid and seccomp only", self.no_namespaces)
        for leftover in self.settings.state_dir.glob(f"{_PROBE_PREFIX}*"):
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
        """Stop the zygote (it kills its workers) and remove our cgroups."""
        self._closed = True
        for task in [self._health, *self._retiring]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
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
        """Nothing is kept per session (every call is a fresh worker)."""

    async def _spawn(self) -> _ZygoteHandle:
        req_parent, req_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        evt_parent, evt_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cfg = {
            "packages": _bare_packages(),
            "req_fd": req_child.fileno(),
            "evt_fd": evt_child.fileno(),
            "daemon_pid": os.getpid(),
            # a worker runs as its call's uid (= gid), which must lie in this range
            "uid_range": [self.uids.first, self.uids.count] if self.uids else None,
            "chroot": self.root,
            "namespaces": self.namespaces,
            "standby": self.settings.max_concurrency,
            "cgroup": {
                "version": self.layout.version,
                "bases": {k: str(v) for k, v in self.layout.bases.items()},
            },
        }
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        try:
            proc = subprocess.Popen(
                [sys.executable, "-E", "-s", "-c", _BOOT, json.dumps(cfg)],
                pass_fds=(req_child.fileno(), evt_child.fileno()),
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                close_fds=True,
            )
        finally:
            req_child.close()
            evt_child.close()
        req_parent.setblocking(False)
        evt_parent.setblocking(False)
        z = _ZygoteHandle(proc, req_parent, evt_parent)
        try:
            ready, _ = await within(asyncio.shield(z.ready), 30)
            if not ready:
                raise TimeoutError("the sandbox zygote did not start within 30 s")
        except BaseException:
            await z.close()
            raise
        return z

    async def _ensure_zygote(self) -> _ZygoteHandle:
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
            self._zygote = await self._spawn()
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
                    await self._replace(z)
            except Exception as exc:  # keep checking: a failed spawn is retried
                log.error("restricted: zygote health check: %s", exc)

    async def _replace(self, z: _ZygoteHandle) -> None:
        """Retire a zygote that does not answer and start a new one at once; the old one is
        killed when its in-flight calls are over (they end by their deadlines)."""
        if self._zygote is not z or z.hung.is_set():
            return
        log.warning("restricted: the sandbox zygote (pid %d) did not answer a health ping "
                    "within %g s; replacing it", z.pid, health.PING_TIMEOUT_S)
        z.retire()
        self._zygote = None
        self.restarts += 1
        task = asyncio.create_task(self._retire(z), name=f"retire-zygote-{z.pid}")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        await self._ensure_zygote()

    async def _retire(self, z: _ZygoteHandle) -> None:
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

    def _result(
        self, inv: Invocation, limits: Limits, status: Status | None, reason: Reason, **kw: Any
    ) -> Result:
        return Result.build(inv, self.name, reason, limits=limits, status=status, **kw)

    async def run(self, invocation: Invocation, limits: Limits, deadline: float) -> Result:
        """Run one python invocation in a fresh confined worker."""
        if invocation.kind is not ToolKind.python:
            return self._result(
                invocation,
                limits,
                Status.rejected,
                Reason.policy,
                cleanup=Cleanup(verified=True),
                message=f"the restricted backend only runs python code, "
                f"not {invocation.kind.value}",
            )
        code = invocation.arguments.get("code")
        if not isinstance(code, str):
            return self._result(
                invocation,
                limits,
                Status.rejected,
                Reason.policy,
                cleanup=Cleanup(verified=True),
                message="argument 'code' must be a string",
            )
        msg = self._request(invocation, limits, deadline, code)
        result, _report = await self._execute(invocation, limits, deadline, msg)
        return result

    def _request(
        self, inv: Invocation, limits: Limits, deadline: float, code: str, probe: str | None = None
    ) -> dict[str, Any]:
        remaining = max(0.05, deadline - time.monotonic())
        return {
            "t": "run",
            "id": f"c{secrets.token_hex(8)}",
            "code": code,
            "allow": list(inv.imports_allow),
            "deny": list(inv.imports_deny),
            "workspace": str(inv.workspace),
            "memory": int(limits.memory_bytes),
            "cpus": float(limits.cpus),
            "pids": int(limits.pids),
            "cpu_seconds": math.ceil(remaining) + 1,
            "output": int(limits.output_bytes),
            "max_file": int(inv.max_file_bytes),
            "uid": inv.uid,
            "probe": probe,
        }

    async def _execute(
        self, inv: Invocation, limits: Limits, deadline: float, msg: dict[str, Any]
    ) -> tuple[Result, dict[str, Any] | None]:
        loop = asyncio.get_running_loop()
        started_at = time.monotonic()
        if self._start_lock is None or not self.settings.restricted_enabled:
            return self._result(
                inv,
                limits,
                Status.error,
                Reason.exited,
                cleanup=Cleanup(verified=True),
                message=f"sandbox unavailable: {self._unavailable}",
            ), None
        reason: Reason | None = None
        exit_info: dict[str, Any] | None = None
        crashed: str | None = None
        try:
            z, worker = await self._take(deadline)
        except (ZygoteDied, TimeoutError) as exc:
            status, reason_ = (
                (Status.timeout, Reason.wall_timeout)
                if isinstance(exc, TimeoutError)
                else (Status.error, Reason.exited)
            )
            return self._result(
                inv,
                limits,
                status,
                reason_,
                cleanup=Cleanup(verified=True),
                message=f"no sandbox worker: {exc}",
            ), None
        z.send(b"t", worker.pid, (msg["memory"], msg["cpus"], msg["pids"]))
        reader = FrameReader(loop, worker.sock.fileno(), limits.output_bytes, limits.timeout_s)
        z.in_use += 1
        try:
            data = json.dumps(msg).encode()
            await loop.sock_sendall(worker.sock, HEADER.pack(len(data)) + data)
            finished, _ = await within(reader.done.wait(), deadline - time.monotonic())
            if not finished:
                reason = Reason.wall_timeout
            if reader.violation is not None and reason is None:
                crashed = f"it broke the result protocol ({reader.violation}) and was killed"
            elif reader.overflow and reason is None:
                reason = Reason.output_limit
            if reason is not None or crashed is not None:
                self._kill(z, worker)
            exit_info = await health.exit_report(z, worker)
            if exit_info is None:  # the zygote hangs: the daemon reaps the worker itself
                exit_info = await health.reap_ourselves(worker, self.layout)
        except asyncio.CancelledError:
            info = await asyncio.shield(self._abort(z, worker))
            verified, detail = self._verify(worker.pid, worker.cgroup, info, z.pid)
            raise CancelledAfterCleanup(verified, detail or "worker killed and reaped") from None
        except (ZygoteDied, OSError, TimeoutError) as exc:
            crashed = f"{type(exc).__name__}: {exc}"
            exit_info = await asyncio.shield(self._abort(z, worker))
        finally:
            z.in_use -= 1
            reader.close()
            worker.close()
        result = await self._finish(
            inv, limits, msg, reader, reason, exit_info, worker, crashed, started_at, z.pid
        )
        if reader.report is not None and exit_info:
            reader.report["exit_info"] = exit_info
        return result, reader.report

    async def _take(self, deadline: float) -> tuple[_ZygoteHandle, _Standby]:
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

    def _kill(self, z: _ZygoteHandle, worker: _Standby) -> None:
        if not worker.kill():
            z.send(b"k", worker.pid)

    async def _abort(self, z: _ZygoteHandle, worker: _Standby) -> dict[str, Any]:
        """Cancellation or a broken zygote: kill the worker, wait for it, clean its cgroup.
        Returns the zygote's exit report of the worker ({} when there is none)."""
        self._kill(z, worker)
        if z.alive:
            with contextlib.suppress(Exception):
                info = await health.exit_report(z, worker)
                return info if info is not None else await health.reap_ourselves(
                    worker, self.layout)
        # zygote gone: the worker dies by PDEATHSIG (and was killed above); prove it, and
        # remove its cgroup
        return await health.reap_ourselves(worker, self.layout)

    async def _finish(
        self,
        inv: Invocation,
        limits: Limits,
        msg: dict[str, Any],
        reader: FrameReader,
        reason: Reason | None,
        exit_info: dict[str, Any] | None,
        call: _Standby,
        crashed: str | None,
        started_at: float,
        zygote_pid: int,
    ) -> Result:
        cap = limits.output_bytes
        budget = OutputBudget(cap)  # stdout and stderr together (sandboxd.rules)
        out = bytes(reader.stdout[: budget.take(len(reader.stdout))])
        err = bytes(reader.stderr[: budget.take(len(reader.stderr))])
        stdout = out.decode("utf-8", "replace")
        stderr = err.decode("utf-8", "replace")
        report = reader.report
        truncated = Truncated(
            stdout=len(out) < len(reader.stdout)
            or bool(report and report.get("truncated_stdout")),
            stderr=len(err) < len(reader.stderr),
        )
        info = exit_info or {}
        resources = Resources(
            wall_ms=int((time.monotonic() - started_at) * 1000),
            cpu_ms=int(info.get("cpu_ms", 0)),
            peak_memory_bytes=int(info.get("peak_memory") or info.get("maxrss") or 0),
        )
        verified, detail = self._verify(call.pid, call.cgroup, info, zygote_pid)
        cleanup = Cleanup(verified=verified, detail=detail)
        exit_code: int | None = info.get("exit_code")
        sig: int | None = info.get("signal")
        value: Any = None
        message: str | None = None
        if crashed is not None:
            return self._result(
                inv,
                limits,
                Status.error,
                Reason.exited,
                stdout=stdout,
                stderr=stderr,
                truncated=truncated,
                resources=resources,
                cleanup=cleanup,
                message=f"sandbox worker failed: {crashed}",
            )
        if reason is None and report is not None and report.get("outcome") == "setup_error":
            return self._result(
                inv,
                limits,
                Status.error,
                Reason.exited,
                exit_code=exit_code,
                resources=resources,
                cleanup=cleanup,
                message=f"sandbox set-up failed: {report.get('message')}",
            )
        if reason is None and report is not None and sig is None:
            outcome = report.get("outcome")
            if outcome == "memory_limit":
                reason = Reason.memory_limit
            elif outcome == "output_limit":
                reason = Reason.output_limit
                if not truncated.stdout:  # the cap cut the worker's own stderr (a traceback)
                    truncated.stderr = True
            else:
                reason = Reason.exited
                exit_code = int(report.get("exit_code", 0) or 0)
                value = report.get("value")
            message = report.get("message") if outcome != "ok" else None
        elif reason is None:
            if info.get("oom"):
                reason = Reason.memory_limit
            elif sig == signal.SIGXCPU or (
                sig == signal.SIGKILL and resources.cpu_ms >= (int(msg["cpu_seconds"]) - 0.2) * 1000
            ):
                reason = Reason.cpu_limit
            else:
                reason = Reason.exited
                message = (
                    f"the worker was killed by signal {sig}"
                    if sig is not None
                    else "the worker exited without a report"
                )
                exit_code = exit_code if exit_code is not None else (128 + (sig or 0))
        if reason is Reason.output_limit:
            truncated.stdout = truncated.stdout or len(reader.stdout) + len(reader.stderr) >= cap
        if reason is not Reason.exited and reason is not Reason.memory_limit:
            message = None  # a limit: the words of the one table (Result.build); a memory
            # limit keeps the worker's explanation when it has one (a limit it cannot start in)
        return self._result(
            inv,
            limits,
            None,
            reason,
            exit_code=exit_code,
            signal=sig,
            stdout=stdout,
            stderr=stderr,
            truncated=truncated,
            value=value,
            resources=resources,
            cleanup=cleanup,
            message=message,
        )

    def _verify(
        self, pid: int | None, cgroup: str | None, info: dict[str, Any], zygote_pid: int
    ) -> tuple[bool, str | None]:
        """Prove the worker is gone: reaped by the zygote, no live process with its pid that is
        still our child, and no cgroup directory left (or, without the zygote's report, killed
        and its cgroup removed by the daemon itself)."""
        if info.get("daemon_verified"):
            return health.verify_ourselves(info)
        problems = []
        if not info:
            problems.append("no exit report from the zygote")
        # pid_exists (one kill(pid, 0)) first: the worker has normally been reaped already,
        # and building a psutil.Process for a gone pid costs several /proc reads
        if pid is not None and psutil.pid_exists(pid):
            try:
                proc = psutil.Process(pid)
                if (
                    proc.ppid() in (zygote_pid, 1)
                    and proc.status() != psutil.STATUS_ZOMBIE
                    and not info
                ):
                    problems.append(f"worker {pid} still running")
                elif proc.ppid() == zygote_pid and not info:
                    problems.append(f"worker {pid} not reaped")
            except psutil.NoSuchProcess:
                pass
            except psutil.Error as exc:
                problems.append(f"psutil: {exc}")
        if info and not info.get("cgroup_empty", True):
            problems.append("processes left in the worker's cgroup")
        return (not problems), ("; ".join(problems) or None)

    # ------------------------------------------------------------ readiness

    async def probe(self) -> ProbeReport:
        """Run trusted probes in fully confined workers: socket blocked, write outside the
        workspace blocked, memory limit enforced, unprivileged (when root), seccomp active."""
        checks: list[ProbeCheck] = []
        ok, reason = self.availability()
        if not ok:
            return ProbeReport(backend=self.name, ok=False, detail=reason or "unavailable")
        z = self._zygote
        if z is not None and z.alive and not await z.ping(health.PING_TIMEOUT_S):
            await self._replace(z)
            return ProbeReport(backend=self.name, ok=False,
                               detail=f"the sandbox zygote (pid {z.pid}) did not answer a "
                               f"health ping within {health.PING_TIMEOUT_S:g} s; replaced")
        # under the state directory (not /tmp): a daemon killed mid-probe leaves it where the
        # next start-up sweep finds it
        base = self.settings.state_dir / f"{_PROBE_PREFIX}{secrets.token_hex(6)}"
        try:
            base.mkdir(parents=True, mode=0o700)
            ws = base / "ws"
            ws.mkdir(mode=0o700)
            outside = base / f"outside-{secrets.token_hex(4)}"
            uid = self.uids.acquire(base.name) if self.uids is not None else None
            if uid is not None:
                os.chown(ws, uid, uid)
            inv = Invocation(
                tool="python",
                kind=ToolKind.python,
                client="probe",
                workspace=ws,
                arguments={"code": ""},
                uid=uid,
            )
            lim = Limits(timeout_s=PROBE_DEADLINE_S, memory_bytes=64 * 1024 * 1024,
                         output_bytes=65536)
            deadline = time.monotonic() + PROBE_DEADLINE_S
            msg = self._request(inv, lim, deadline, "", probe="basic")
            msg["outside_path"] = str(outside)
            msg["expect_unprivileged"] = self.root
            msg["expect_namespaces"] = self.namespaces
            msg["no_namespaces_reason"] = self.no_namespaces
            res, report = await self._probe_run(inv, lim, deadline, msg)
            probe = (report or {}).get("probe") or {}
            for name in (
                "socket_blocked",
                "write_outside_blocked",
                "unprivileged",
                "seccomp",
                "landlock",
                "pid_namespace",
            ):
                ok_, detail = probe.get(
                    name, [False, f"no result ({res.status.value}: {res.message})"]
                )
                if name == "write_outside_blocked" and outside.exists():
                    ok_, detail = False, f"{outside} was written"
                checks.append(ProbeCheck(name=name, ok=bool(ok_), detail=str(detail)))
            msg = self._request(inv, lim, time.monotonic() + PROBE_DEADLINE_S, "",
                                probe="memory")
            res, report = await self._probe_run(inv, lim, time.monotonic() + PROBE_DEADLINE_S,
                                                msg)
            if res.termination.reason is Reason.memory_limit:
                detail = ((report or {}).get("probe") or {}).get("memory_limit", [True, ""])[
                    1
                ] or "killed by the cgroup memory limit"
                checks.append(ProbeCheck(name="memory_limit", ok=True, detail=str(detail)))
            else:
                checks.append(
                    ProbeCheck(
                        name="memory_limit",
                        ok=False,
                        detail=f"{res.status.value}/{res.termination.reason}: {res.message}",
                    )
                )
            checks.append(
                ProbeCheck(
                    name="cgroup",
                    ok=bool(self.layout.version) or not self.root,
                    detail=self.layout.detail or "not root: no cgroups",
                )
            )
            checks.append(
                ProbeCheck(
                    name="cleanup", ok=res.cleanup.verified, detail=res.cleanup.detail or "verified"
                )
            )
        finally:
            if self.uids is not None:
                self.uids.release(base.name)
            await asyncio.to_thread(fstree.remove_tree_quietly, base)
        return ProbeReport(
            backend=self.name,
            ok=all(c.ok for c in checks),
            checks=checks,
            detail="" if all(c.ok for c in checks) else "confinement check failed",
        )

    async def _probe_run(
        self, inv: Invocation, lim: Limits, deadline: float, msg: dict[str, Any]
    ) -> tuple[Result, dict[str, Any] | None]:
        return await self._execute(inv, lim, deadline, msg)
