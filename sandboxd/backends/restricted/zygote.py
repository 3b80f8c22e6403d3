"""The zygote: a single-threaded process that pre-imports everything and forks one worker per
call.

The daemon is multi-threaded (uvicorn, asyncio, executor threads), and forking a
multi-threaded process is unsafe, so the daemon starts this process once (``start()``). The
zygote keeps up to ``STANDBY_WORKERS`` (one per scheduler slot; ``IDLE_STANDBY`` while idle)
forked, prepared, never-used workers. For each it hands the
daemon (over a ``SOCK_SEQPACKET`` pair, JSON messages with ``SCM_RIGHTS``):

* ``{"t": "standby", "pid", "cgroup"}`` with two descriptors: the daemon's end of a stream
  socket connected to the worker, and a pidfd of the worker (race-free kill);
* ``{"t": "exit", "pid", "exit_code", "signal", "cpu_ms", "maxrss", "peak_memory", "oom",
  "cgroup_empty"}`` once a worker has been reaped (``wait4``) and its cgroup read (the cgroup
  is removed right after this message);
* ``{"t": "ready", "pid"}`` once, at start-up.

The daemon sends the zygote fixed-size binary messages (``CTRL`` in :mod:`.zygote_protocol`:
kind, pid, memory, cpus, pids): ``t`` "took" (a standby was used: fork the next one, preparing
its cgroup with these limits, and keep the full standby count), ``u`` the same for a readiness
probe (the standby count stays as it is), as a fallback when pidfds are unavailable, ``k``
"kill" (limits unused), ``i`` "idle" (keep only ``IDLE_STANDBY`` standbys: the daemon then kills
the ones it no longer keeps) and ``p`` "ping" (the pid field is a sequence number), answered
``{"t": "pong", "seq"}`` (health check).

The zygote's per-call loop avoids json, pathlib and other heavy machinery: every page of its
heap it writes to while workers still share it costs a copy-on-write fault, per call.

A call therefore goes straight from the daemon to its worker: the daemon writes the request
(``length + JSON``) to the worker socket; the worker confines itself, runs the code and writes
:mod:`sandboxd.protocol.wire` frames back: ``o`` stdout, ``e`` stderr, ``r`` the final JSON report;
then it exits, which the daemon sees as EOF. The daemon reads them as an attacker's writes
(:mod:`.frames`). The zygote
never runs user code and never sees user input or output. When the daemon goes away (EOF, or
the parent-death signal) it kills its workers and exits.
"""

from __future__ import annotations

import _socket
import contextlib
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from sandboxd.backends.restricted import forking, worker
from sandboxd.backends.restricted.zygote_protocol import (
    CTRL,
    FDS1,
    FDS2,
    IDLE_STANDBY,
    send_packet,
)

#: the most standby workers a zygote keeps (the target is min(this, max_concurrency))
STANDBY_WORKERS = 4
#: each end's send buffer on a worker's socket (the host's net.core.wmem_max caps it): a
#: fork's pickled state (tens of MB) crosses in a few wake-ups of the daemon, not hundreds;
#: memory only while bytes are in flight, and the reader's bounds are unchanged
SOCKET_SNDBUF = 4 * 1024 * 1024


class _Worker:
    __slots__ = ("cgroup", "standby")

    def __init__(self, cgroup: str) -> None:
        self.cgroup = cgroup
        self.standby = True


class Zygote:
    """The zygote's state and main loop."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        import gc

        from sandboxd.backends.restricted import cgroups, landlock, namespaces, seccomp

        self.cfg = cfg
        self.req = socket.socket(fileno=cfg["req_fd"])
        self.evt = socket.socket(fileno=cfg["evt_fd"])
        self.req.setblocking(True)
        self.evt.setblocking(True)
        cg = cfg.get("cgroup") or {}
        self.layout = cgroups.CgroupLayout(
            version=int(cg.get("version", 0)),
            bases={k: Path(v) for k, v in (cg.get("bases") or {}).items()},
        )
        # as root, every worker is PID 1 of its own PID namespace (and has its own IPC
        # namespace): see namespaces.py; its seccomp filter then knows its pid (1)
        self.forker = namespaces.NamespaceForker() if cfg.get("namespaces") else None
        self.lifeline = namespaces.Lifeline()
        self.program = seccomp.SeccompProgram.build(own_pid=1 if self.forker else 0)
        self.workers: dict[int, _Worker] = {}
        self.standby_max = max(1, min(STANDBY_WORKERS, int(cfg.get("standby", 2))))
        self.standby_target = min(IDLE_STANDBY, self.standby_max)
        self.leftover: list[str] = []  # cgroups whose removal has to be retried
        # cgroup limits a standby applies in advance: those of the latest call
        self.preset: tuple[int, float, int] = (256 * 1024 * 1024, 1.0, 64)
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        cfg["zygote_pid"] = os.getpid()
        cfg["landlock_abi"] = landlock.landlock_abi()
        forking.check_single_threaded()
        gc.collect()
        gc.freeze()  # the workers' GC then never walks (and copies) the zygote's objects

    @property
    def standby_count(self) -> int:
        return sum(1 for w in self.workers.values() if w.standby)

    def serve(self) -> None:
        self.refill()
        send_packet(self.evt, {"t": "ready", "pid": os.getpid()})
        watched: list[socket.socket | int] = [self.req, self.wake_r]
        while True:
            # a cgroup whose removal failed (the kernel still tearing the worker down: EBUSY
            # for a moment on v2) is retried soon, not only at the next call
            wait = 0.05 if self.leftover else None
            try:
                ready, _, _ = select.select(watched, [], [], wait)
            except InterruptedError:
                continue
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.wake_r, 512):
                        pass
                self.reap()
            if self.req in ready:
                try:
                    data = self.req.recv(65536)
                except ConnectionError:
                    data = b""
                if not data:
                    self.shutdown()
                    return
                self.handle(data)
            self.reap()
            self.refill()
            if self.leftover:
                self.leftover = [c for c in self.leftover if not self.layout.remove(c, 0.0)]

    def refill(self) -> None:
        while self.standby_count < self.standby_target:
            if not self.spawn():
                break

    def spawn(self) -> bool:
        # Plain C-level calls where the stdlib offers Python wrappers (socket.socketpair,
        # socket.send_fds, secrets, contextlib.suppress): while the new worker shares the
        # zygote's pages, each page of Python code and data run here costs a copy.
        ours, theirs = _socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for end in (ours, theirs):  # a fork's state crosses in fewer wake-ups (see .carry)
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_SNDBUF)
        cgroup = "w" + os.urandom(8).hex()
        try:
            pid = self.forker.fork() if self.forker is not None else forking.fork()
        except OSError:
            ours.close()
            theirs.close()
            return False
        if pid == 0:  # the worker
            status = 71
            try:
                forking.after_fork_in_worker()
                ours.close()
                status = worker.run_worker(
                    theirs,
                    cgroup,
                    self.cfg,
                    self.layout,
                    self.program,
                    self.preset,
                    self.lifeline.read_fd,
                )
            finally:
                os._exit(status)
        theirs_fd = theirs.fileno()  # the worker's number for its socket (see .idle)
        theirs.close()
        self.workers[pid] = _Worker(cgroup)
        pidfd = -1
        try:  # noqa: SIM105 - contextlib.suppress is Python code (see above)
            pidfd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            pass
        fds = FDS2.pack(ours.fileno(), pidfd) if pidfd >= 0 else FDS1.pack(ours.fileno())
        try:
            # cgroup is "w" + hex: no JSON escaping needed
            msg = (f'{{"t":"standby","pid":{pid},"cgroup":"{cgroup}","fd":{theirs_fd}}}'
                   .encode())
            self.evt.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        finally:
            ours.close()
            if pidfd >= 0:
                os.close(pidfd)
        return True

    def handle(self, data: bytes) -> None:
        if len(data) != CTRL.size:
            return
        kind, pid, memory, cpus, pids = CTRL.unpack(data)
        worker = self.workers.get(pid)
        if kind in (b"t", b"u"):
            # a short call's worker can exit, and be reaped on this loop before this message
            # is read: the take counts all the same
            if worker is not None:
                worker.standby = False
            self.preset = (memory, cpus, pids)
            if kind == b"t":  # a call, not a readiness probe (u)
                self.standby_target = self.standby_max
        elif kind == b"i":  # idle: the daemon kills the standbys it no longer keeps
            self.standby_target = min(IDLE_STANDBY, self.standby_max)
        elif kind == b"p":
            self.evt.send(f'{{"t":"pong","seq":{pid}}}'.encode())
        elif kind == b"k" and worker is not None:
            for killer in (os.killpg, os.kill):
                with contextlib.suppress(OSError):
                    killer(pid, signal.SIGKILL)

    def reap(self) -> None:
        while self.workers:
            try:
                pid, status, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker = self.workers.pop(pid, None)
            if worker is None:
                continue
            peak, oom, empty = (
                self.layout.stats(worker.cgroup) if self.layout.version else (0, False, True)
            )
            exit_code = os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else "null"
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else "null"
            oom_s, empty_s = ("true" if oom else "false"), ("true" if empty else "false")
            self.evt.send(
                f'{{"t":"exit","pid":{pid},"cgroup":"{worker.cgroup}","exit_code":{exit_code},'
                f'"signal":{sig},"cpu_ms":{int((ru.ru_utime + ru.ru_stime) * 1000)},'
                f'"maxrss":{int(ru.ru_maxrss) * 1024},"peak_memory":{int(peak)},'
                f'"oom":{oom_s},"cgroup_empty":{empty_s}}}'.encode()
            )
            # removal after the report keeps it off the call's critical path; a failure is
            # retried on every loop and by the start-up/close sweep
            if self.layout.version and not self.layout.remove(worker.cgroup, timeout=0.0):
                self.leftover.append(worker.cgroup)

    def shutdown(self) -> None:
        for pid in list(self.workers):
            for killer in (os.killpg, os.kill):
                with contextlib.suppress(OSError):
                    killer(pid, signal.SIGKILL)
        deadline = time.monotonic() + 2
        while self.workers and time.monotonic() < deadline:
            try:
                pid, _status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            worker = self.workers.pop(pid, None)
            if worker and self.layout.version:
                self.layout.remove(worker.cgroup)


def main(cfg: dict[str, Any]) -> None:
    """Entry point (see ``zygote_client.py`` for how it is started)."""
    from sandboxd.backends.restricted import contain

    contain.prctl(contain.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != cfg["daemon_pid"]:
        sys.exit(0)
    worker.preimport()
    worker.prime()
    Zygote(cfg).serve()
