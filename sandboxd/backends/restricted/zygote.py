"""The zygote: a single-threaded process that pre-imports everything and forks one worker per
call.

The daemon is multi-threaded (uvicorn, asyncio, executor threads), and forking a
multi-threaded process is unsafe, so the daemon starts this process once (``start()``). The
zygote keeps up to ``STANDBY_WORKERS`` (one per scheduler slot) forked, prepared, never-used
workers. For each it hands the
daemon (over a ``SOCK_SEQPACKET`` pair, JSON messages with ``SCM_RIGHTS``):

* ``{"t": "standby", "pid", "cgroup"}`` with two descriptors: the daemon's end of a stream
  socket connected to the worker, and a pidfd of the worker (race-free kill);
* ``{"t": "exit", "pid", "exit_code", "signal", "cpu_ms", "maxrss", "peak_memory", "oom",
  "cgroup_empty"}`` once a worker has been reaped (``wait4``) and its cgroup read (the cgroup
  is removed right after this message);
* ``{"t": "ready", "pid"}`` once, at start-up.

The daemon sends the zygote fixed-size binary messages (``_CTRL``: kind, pid, memory, cpus,
pids): ``t`` "took" (a standby was used: fork the next one, preparing its cgroup with these
limits), as a fallback when pidfds are unavailable, ``k`` "kill" (limits unused), and ``p``
"ping" (the pid field is a sequence number), answered ``{"t": "pong", "seq"}`` (health check).

The zygote's per-call loop avoids json, pathlib and other heavy machinery: every page of its
heap it writes to while workers still share it costs a copy-on-write fault, per call.

A call therefore goes straight from the daemon to its worker: the daemon writes the request
(``length + JSON``) to the worker socket; the worker confines itself, runs the code and writes
:mod:`sandboxd.wire` frames back: ``o`` stdout, ``e`` stderr, ``r`` the final JSON report;
then it exits, which the daemon sees as EOF. The daemon reads them as an attacker's writes
(:mod:`.frames`). The zygote
never runs user code and never sees user input or output. When the daemon goes away (EOF, or
the parent-death signal) it kills its workers and exits.
"""

from __future__ import annotations

import _socket
import contextlib
import errno
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

from sandboxd import wire

_HEADER = struct.Struct("!I")
#: daemon -> zygote control message: kind (b"t" took, b"k" kill, b"p" ping), pid, memory,
#: cpus, pids
_CTRL = struct.Struct("!cIQdI")
_FDS1, _FDS2 = struct.Struct("i"), struct.Struct("ii")  # SCM_RIGHTS payloads


def _preimport() -> None:
    """Import everything a worker may need, so that nothing is imported after the fork (the
    worker may be chrooted into its workspace and cannot read the host's stdlib)."""
    import _strptime  # noqa: F401 - datetime.strptime
    import calendar  # noqa: F401
    import encodings.ascii
    import encodings.cp1252
    import encodings.hex_codec
    import encodings.idna
    import encodings.latin_1
    import encodings.raw_unicode_escape
    import encodings.unicode_escape
    import encodings.utf_8_sig
    import encodings.utf_16
    import encodings.utf_32  # noqa: F401
    import locale  # noqa: F401
    import unicodedata  # noqa: F401

    import sandboxd.backends.restricted.lang  # noqa: F401


#: trusted sample program the zygote runs on itself before forking (see :func:`_prime`)
_PRIME_SOURCE = (
    "import math\n"
    "class A:\n"
    "    def __init__(self, x):\n"
    "        self.x = x\n"
    "    def f(self, y):\n"
    "        return [self.x + y]\n"
    "def g(*args, **kw):\n"
    "    return {k: v for k, v in kw.items()}, sum(i * i for i in args)\n"
    "a = A(1)\n"
    "a.x += 1\n"
    "d = {'k': 1}\n"
    "d['k'] += 1\n"
    "try:\n"
    "    1 / 0\n"
    "except ZeroDivisionError as e:\n"
    "    msg = f'{e!r} {math.pi:.2f}'\n"
    "finally:\n"
    "    pass\n"
    "print(a.f(2), g(1, 2, k=3), msg, len([x for x in range(3)]), 'x'.join(['a', 'b']))\n"
    "print(1)\n"
    "a.f(2)[0] + 1\n"
)


def _prime(rounds: int = 12) -> None:
    """Run a fixed, trusted sample call (compile + run) in the zygote itself, before it forks.

    CPython 3.11 specialises ("quickens") a function's bytecode in place after a few calls
    and fills lazy caches on first use; done here once, every worker inherits the result
    instead of redoing it - and copying the pages it writes to - per call. No user input is
    involved: the source is the constant above, and the per-run state it leaves is reset.
    """
    import linecache

    from sandboxd.backends.restricted import lang

    for _ in range(rounds):
        lang.run_user_code(
            _PRIME_SOURCE,
            imports_allow=["math"],
            imports_deny=[],
            workspace="/",
            output_bytes=4096,
            max_file_bytes=1,
            emit=lambda kind, data: None,
        )
    lang.STATE.limit_hit, lang.STATE.memory_hit = None, False
    lang.STATE.value, lang.STATE.has_value = None, False
    lang._Stdout.stream = None
    lang._user_classes.clear()
    linecache.cache.pop(lang.SANDBOX_FILENAME, None)


def send_msg(sock: socket.socket, msg: dict[str, Any]) -> None:
    """Length-prefixed JSON on a stream socket."""
    data = json.dumps(msg).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def send_packet(sock: socket.socket, msg: dict[str, Any], fds: list[int] | None = None) -> None:
    """One JSON message on a SOCK_SEQPACKET socket, optionally with descriptors."""
    data = json.dumps(msg).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def _recv_exact(sock: _socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_msg(sock: _socket.socket) -> dict[str, Any]:
    """Length-prefixed JSON from a stream socket. Plain ``recv``: descriptors (nobody sends
    any) would be discarded by the kernel, never installed in this process."""
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    return json.loads(_recv_exact(sock, size))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _worker(
    sock: _socket.socket,
    cgroup: str,
    cfg: dict[str, Any],
    layout: Any,
    program: Any,
    preset: tuple[int, float, int],
    lifeline: int,
) -> int:
    """A standby worker: prepares itself, waits for its one call, confines itself, runs it.
    Returns the exit status for ``os._exit``."""
    from sandboxd.backends.restricted import confine, lang, namespaces

    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    setup_error: str | None = None
    try:
        confine.prepare_worker([sock.fileno(), lifeline], layout, cgroup, preset)
        if cfg.get("namespaces"):
            namespaces.enter_ipc_namespace()
        confine.prctl(confine.PR_SET_PDEATHSIG, signal.SIGKILL)
        if namespaces.parent_gone(lifeline):
            return 0
    except BaseException as exc:
        setup_error = f"{type(exc).__name__}: {exc}"
    baseline = confine.vm_size()
    try:
        msg = recv_msg(sock)
    except (EOFError, OSError, ValueError):
        return 0
    t_recv = time.perf_counter()
    wfd = sock.fileno()

    def emit(kind: bytes, data: bytes) -> None:
        _write_all(wfd, wire.encode(kind, data))

    uid = msg.get("uid")
    uid_range = cfg.get("uid_range")
    if setup_error is None and uid_range is not None and (
        not isinstance(uid, int) or not uid_range[0] <= uid < uid_range[0] + uid_range[1]
    ):
        setup_error = f"the call's uid {uid!r} is not a sandbox uid"
    if setup_error is None:
        spec = confine.ChildSpec(
            cgroup=cgroup,
            workspace=msg["workspace"],
            memory_bytes=int(msg["memory"]),
            cpus=float(msg["cpus"]),
            pids=int(msg["pids"]),
            cpu_seconds=int(msg["cpu_seconds"]),
            max_file_bytes=int(msg["max_file"]),
            uid=uid if uid_range is not None else None,
            gid=uid if uid_range is not None else None,
            zygote_pid=cfg["zygote_pid"],
            chroot=bool(cfg.get("chroot")),
            baseline_vm=baseline,
            applied=preset,
            landlock_abi=int(cfg.get("landlock_abi", 0)),
            lifeline_fd=lifeline,
        )
        try:
            confine.enter_sandbox(spec, layout, program)
        except MemoryError as exc:  # the call's memory limit is below the worker's needs
            emit(b"r", json.dumps({"outcome": "memory_limit", "message": str(exc)}).encode())
            return 70
        except BaseException as exc:
            setup_error = f"{type(exc).__name__}: {exc}"
    if setup_error is not None:
        emit(b"r", json.dumps({"outcome": "setup_error", "message": setup_error}).encode())
        return 70
    import warnings

    warnings.simplefilter("ignore")
    if msg.get("probe"):
        report = _probe(msg)
    else:
        workspace = "/" if spec.chroot else spec.workspace
        report = lang.run_user_code(
            msg["code"],
            imports_allow=msg.get("allow", []),
            imports_deny=msg.get("deny", []),
            workspace=workspace,
            output_bytes=int(msg["output"]),
            max_file_bytes=spec.max_file_bytes,
            emit=emit,
        )
    report["worker_us"] = int((time.perf_counter() - t_recv) * 1e6)
    emit(b"r", json.dumps(report).encode())
    return 0


def _probe(msg: dict[str, Any]) -> dict[str, Any]:
    """Trusted self-test code run inside a fully confined worker (readiness probe)."""
    from sandboxd.backends.restricted import confine

    checks: dict[str, list[Any]] = {}
    kind = msg.get("probe")
    if kind == "memory":
        limit = int(msg["memory"])
        blocks = []
        try:
            while len(blocks) * (4 << 20) < 3 * limit:
                blocks.append(b"x" * (4 << 20))
        except MemoryError:
            return {
                "outcome": "memory_limit",
                "probe": {"memory_limit": [True, f"MemoryError after {len(blocks) * 4} MiB"]},
            }
        return {
            "outcome": "ok",
            "probe": {
                "memory_limit": [
                    False,
                    f"allocated {len(blocks) * 4} MiB without hitting the limit",
                ]
            },
        }
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.close()
        checks["socket_blocked"] = [False, "socket() succeeded"]
    except OSError as exc:
        checks["socket_blocked"] = [exc.errno == errno.EPERM, f"socket(): {exc}"]
    target = msg.get("outside_path", "")
    try:
        with open(target, "w") as f:
            f.write("escaped")
        checks["write_outside_blocked"] = [False, f"wrote {target}"]
    except OSError as exc:
        checks["write_outside_blocked"] = [True, f"open(outside, 'w'): {type(exc).__name__}"]
    uid = os.getuid()
    abi = confine.landlock_abi()
    checks["landlock"] = [
        abi == 0 or confine.LANDLOCK_STATUS.startswith("enforced"),
        confine.LANDLOCK_STATUS,
    ]
    checks["unprivileged"] = [uid != 0 or not msg.get("expect_unprivileged"), f"uid {uid}"]
    pid = os.getpid()
    checks["pid_namespace"] = [
        pid == 1 or not msg.get("expect_namespaces"),
        f"pid {pid} in its own PID namespace" if pid == 1 else
        f"pid {pid}: no PID namespace" + (f" ({msg['no_namespaces_reason']}; sandboxes are "
                                          "separated by uid and seccomp)"
                                          if msg.get("no_namespaces_reason") else ""),
    ]
    try:
        mode = confine.prctl(confine.PR_GET_SECCOMP)
    except OSError:
        mode = -1
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        forked = True
    except OSError:
        forked = False
    checks["seccomp"] = [
        mode == 2 and not forked,
        f"seccomp mode {mode}, fork {'allowed' if forked else 'denied'}",
    ]
    return {"outcome": "ok", "probe": checks}


#: the most standby workers a zygote keeps (the target is min(this, max_concurrency))
STANDBY_WORKERS = 4


class _Worker:
    __slots__ = ("cgroup", "standby")

    def __init__(self, cgroup: str) -> None:
        self.cgroup = cgroup
        self.standby = True


class Zygote:
    """The zygote's state and main loop."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        import gc

        from sandboxd.backends.restricted import confine, namespaces

        self.cfg = cfg
        self.req = socket.socket(fileno=cfg["req_fd"])
        self.evt = socket.socket(fileno=cfg["evt_fd"])
        self.req.setblocking(True)
        self.evt.setblocking(True)
        cg = cfg.get("cgroup") or {}
        self.layout = confine.CgroupLayout(
            version=int(cg.get("version", 0)),
            bases={k: Path(v) for k, v in (cg.get("bases") or {}).items()},
        )
        # as root, every worker is PID 1 of its own PID namespace (and has its own IPC
        # namespace): see namespaces.py; its seccomp filter then knows its pid (1)
        self.forker = namespaces.NamespaceForker() if cfg.get("namespaces") else None
        self.lifeline = namespaces.Lifeline()
        self.program = confine.SeccompProgram.build(own_pid=1 if self.forker else 0)
        self.workers: dict[int, _Worker] = {}
        self.standby_target = max(1, min(STANDBY_WORKERS, int(cfg.get("standby", 2))))
        self.leftover: list[str] = []  # cgroups whose removal has to be retried
        # cgroup limits a standby applies in advance: those of the latest call
        self.preset: tuple[int, float, int] = (256 * 1024 * 1024, 1.0, 64)
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        cfg["zygote_pid"] = os.getpid()
        cfg["landlock_abi"] = confine.landlock_abi()
        gc.collect()
        gc.freeze()  # the workers' GC then never walks (and copies) the zygote's objects

    @property
    def standby_count(self) -> int:
        return sum(1 for w in self.workers.values() if w.standby)

    def serve(self) -> None:
        self.refill()
        send_packet(self.evt, {"t": "ready", "pid": os.getpid()})
        while True:
            # a cgroup whose removal failed (the kernel still tearing the worker down: EBUSY
            # for a moment on v2) is retried soon, not only at the next call
            wait = 0.05 if self.leftover else None
            try:
                ready, _, _ = select.select([self.req, self.wake_r], [], [], wait)
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
        cgroup = "w" + os.urandom(8).hex()
        try:
            pid = self.forker.fork() if self.forker is not None else os.fork()
        except OSError:
            ours.close()
            theirs.close()
            return False
        if pid == 0:  # the worker
            status = 71
            try:
                ours.close()
                status = _worker(
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
        theirs.close()
        self.workers[pid] = _Worker(cgroup)
        pidfd = -1
        try:  # noqa: SIM105 - contextlib.suppress is Python code (see above)
            pidfd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            pass
        fds = _FDS2.pack(ours.fileno(), pidfd) if pidfd >= 0 else _FDS1.pack(ours.fileno())
        try:
            # cgroup is "w" + hex: no JSON escaping needed
            msg = f'{{"t":"standby","pid":{pid},"cgroup":"{cgroup}"}}'.encode()
            self.evt.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        finally:
            ours.close()
            if pidfd >= 0:
                os.close(pidfd)
        return True

    def handle(self, data: bytes) -> None:
        if len(data) != _CTRL.size:
            return
        kind, pid, memory, cpus, pids = _CTRL.unpack(data)
        worker = self.workers.get(pid)
        if kind == b"t" and worker is not None:
            worker.standby = False
            self.preset = (memory, cpus, pids)
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
    """Entry point (see ``backend.py`` for how it is started)."""
    from sandboxd.backends.restricted import confine

    confine.prctl(confine.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != cfg["daemon_pid"]:
        sys.exit(0)
    _preimport()
    _prime()
    Zygote(cfg).serve()
