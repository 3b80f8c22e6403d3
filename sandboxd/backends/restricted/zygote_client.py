"""The daemon's client of the zygote: starting its process (bare packages, :data:`_BOOT`), its
control socket (``CTRL`` messages: took a standby, kill, ping) and its event socket (standby
workers handed over with their socket and pidfd, exit reports, pongs, readiness).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import sandboxd
from sandboxd.backends.restricted.zygote_protocol import CTRL, IDLE_AFTER_S, IDLE_STANDBY
from sandboxd.errors import SandboxdError
from sandboxd.util.deadline import within

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


class StandbyWorker:
    """A prepared worker the zygote handed over: its socket, pidfd and cgroup."""

    def __init__(
        self,
        pid: int,
        sock: socket.socket,
        pidfd: int | None,
        cgroup: str,
        loop: asyncio.AbstractEventLoop,
        fd: int = -1,
    ) -> None:
        self.pid = pid
        #: the worker's own descriptor of its socket (where its kernel loop reads: see
        #: :mod:`.idle`), as the zygote that forked it knows it
        self.fd = fd
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

    def signal(self, signum: int) -> bool:
        """Send ``signum`` through the pidfd (no pid-reuse race); False without a pidfd or
        when the process is gone."""
        if self.pidfd is None:
            return False
        try:
            signal.pidfd_send_signal(self.pidfd, signum)
        except OSError:
            return False
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


class ZygoteHandle:
    """A running zygote: process, sockets, standby workers and workers in use."""

    def __init__(
        self, proc: subprocess.Popen[bytes], req: socket.socket, evt: socket.socket
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.proc = proc
        self.pid = proc.pid
        self.req = req
        self.evt = evt
        self.workers: dict[int, StandbyWorker] = {}  # every worker not yet reported as exited
        self.standby: collections.deque[StandbyWorker] = collections.deque()
        self.standby_ready = asyncio.Event()
        self.ready: asyncio.Future[int] = self.loop.create_future()
        self.alive = True
        self.hung = asyncio.Event()  # failed a health ping: retired, no new calls
        self.in_use = 0  # calls holding one of its workers
        self._pongs: dict[int, asyncio.Future[None]] = {}
        self._ping_seq = 0
        self._last_take = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None
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

    async def take(self, deadline: float) -> StandbyWorker:
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

    def took(self, worker: StandbyWorker, preset: tuple[int, float, int],
             probe: bool = False) -> None:
        """Tell the zygote a standby was taken (``t``: fork the next one, with ``preset``
        limits, and keep the full standby count). A readiness probe's take (``u``) is not a
        call: it leaves the standby count as it is; once no call took a standby for
        ``IDLE_AFTER_S``, :meth:`idle`."""
        self.send(b"u" if probe else b"t", worker.pid, preset)
        if probe:
            return
        self._last_take = self.loop.time()
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_at(self._last_take + IDLE_AFTER_S, self._idle_check)

    def _idle_check(self) -> None:
        due = self._last_take + IDLE_AFTER_S
        if self.loop.time() < due:  # a call since: check again then
            self._idle_timer = self.loop.call_at(due, self._idle_check)
            return
        self._idle_timer = None
        self.idle()

    def idle(self) -> None:
        """Keep only ``IDLE_STANDBY`` standby workers: the zygote lowers its target first
        (``i``, so that it does not fork replacements), then the surplus standbys, never used,
        are killed (a call takes standbys from the left: the newest go)."""
        if not self.alive or len(self.standby) <= IDLE_STANDBY:
            return
        self.send(b"i", 0)
        while len(self.standby) > IDLE_STANDBY:
            worker = self.standby.pop()
            if not worker.kill():
                self.send(b"k", worker.pid)
            worker.close()

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
            worker = StandbyWorker(int(msg["pid"]), sock, pidfd, str(msg["cgroup"]), self.loop,
                                   int(msg.get("fd", -1)))
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
            ended = self.workers.pop(int(msg.get("pid", -1)), None)
            if ended is not None:
                if not ended.exited.done():
                    ended.exited.set_result(msg)
                if ended in self.standby:  # died while on standby
                    self.standby.remove(ended)
                    ended.close()

    def died(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
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


async def spawn_zygote(cfg: dict[str, Any]) -> ZygoteHandle:
    """Start a zygote with ``cfg`` (identities, chroot, namespaces, standby count, cgroup
    layout) and wait for its ``ready`` event (30 s at most)."""
    req_parent, req_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    evt_parent, evt_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    cfg = {
        "packages": _bare_packages(),
        "req_fd": req_child.fileno(),
        "evt_fd": evt_child.fileno(),
        "daemon_pid": os.getpid(),
        **cfg,
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
    z = ZygoteHandle(proc, req_parent, evt_parent)
    try:
        ready, _ = await within(asyncio.shield(z.ready), 30)
        if not ready:
            raise TimeoutError("the sandbox zygote did not start within 30 s")
    except BaseException:
        await z.close()
        raise
    return z
