"""The zygote: a single-threaded process that pre-imports everything and forks one worker per
call.

The daemon is multi-threaded (uvicorn, asyncio, executor threads), and forking a
multi-threaded process is unsafe, so the daemon starts this process once (``start()``) and
talks to it over two unix stream sockets with a tiny length-prefixed JSON protocol:

* daemon -> zygote (``req``): ``{"t": "run", ...}`` with the write end of the call's result
  pipe attached (``SCM_RIGHTS``), and ``{"t": "kill", "id": ...}``;
* zygote -> daemon (``evt``): ``{"t": "ready"}``, ``{"t": "started", "id", "pid"}``,
  ``{"t": "exit", "id", "pid", "exit_code", "signal", "wall_ms", "cpu_ms", "maxrss",
  "peak_memory", "oom", "cgroup_removed"}``, ``{"t": "error", "id", "message"}``.

The worker writes its output and final report to the result pipe in frames
``kind (1 byte) + length (4 bytes, big endian) + payload``: ``o`` stdout, ``e`` stderr, ``r`` the
final JSON report. The zygote never runs user code and never reads user output; it forks,
kills on request, reaps (``wait4`` gives the CPU time), reads the cgroup's peak memory and OOM
count, removes the cgroup, and reports. When the daemon goes away (EOF, or the parent-death
signal) it kills its workers and exits.
"""

from __future__ import annotations

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

_HEADER = struct.Struct("!I")
_FRAME = struct.Struct("!cI")


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


def send_msg(sock: socket.socket, msg: dict[str, Any]) -> None:
    data = json.dumps(msg).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_msg(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    head, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, 4)
    if not head:
        raise EOFError
    if len(head) < _HEADER.size:
        head += _recv_exact(sock, _HEADER.size - len(head))
    (size,) = _HEADER.unpack(head)
    return json.loads(_recv_exact(sock, size)), list(fds)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _warm_up() -> None:
    """Trusted warm-up in a standby worker: touch (copy-on-write) the pages a call will touch,
    so that the call itself does not pay for it."""
    from sandboxd.backends.restricted import lang

    lang.compile_user_code(
        "import math\nclass A:\n    def f(self, x):\n        return [x]\n"
        "a = A()\nprint(a.f(1), math.pi)\na.f(2)[0] + 1\n"
    )
    lang.make_globals(
        lang.ImportHook([], []),
        lang.WorkspaceOpener("/", 1),
        lang.OutputStream(b"o", lambda k, d: None, 1),
    )


def _worker(
    sock: socket.socket,
    cgroup: str,
    cfg: dict[str, Any],
    layout: Any,
    program: Any,
    preset: tuple[int, float, int],
    warm: bool,
) -> int:
    """A standby worker: prepares itself, waits for its one call, confines itself, runs it.
    Returns the exit status for ``os._exit``."""
    from sandboxd.backends.restricted import confine, lang

    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    setup_error: str | None = None
    try:
        confine.prepare_worker([sock.fileno()], layout, cgroup, preset)
        confine.prctl(confine.PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != cfg["zygote_pid"]:
            return 0
        if warm:
            _warm_up()
    except BaseException as exc:
        setup_error = f"{type(exc).__name__}: {exc}"
    baseline = confine.vm_size()
    try:
        msg, fds = recv_msg(sock)
    except (EOFError, OSError):
        return 0
    t_recv = time.perf_counter()
    sock.close()
    if not fds:
        return 72
    wfd = fds[0]
    for extra in fds[1:]:
        os.close(extra)

    def emit(kind: bytes, data: bytes) -> None:
        _write_all(wfd, _FRAME.pack(kind, len(data)) + data)

    if setup_error is None:
        spec = confine.ChildSpec(
            cgroup=cgroup,
            workspace=msg["workspace"],
            memory_bytes=int(msg["memory"]),
            cpus=float(msg["cpus"]),
            pids=int(msg["pids"]),
            cpu_seconds=int(msg["cpu_seconds"]),
            max_file_bytes=int(msg["max_file"]),
            uid=cfg.get("uid"),
            gid=cfg.get("gid"),
            zygote_pid=cfg["zygote_pid"],
            chroot=bool(cfg.get("chroot")),
            baseline_vm=baseline,
            applied=preset,
            landlock_abi=int(cfg.get("landlock_abi", 0)),
        )
        try:
            confine.enter_sandbox(spec, layout, program)
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


STANDBY_WORKERS = 2


class _Worker:
    __slots__ = ("call_id", "cgroup", "sock", "started")

    def __init__(self, cgroup: str, sock: socket.socket) -> None:
        self.cgroup = cgroup
        self.sock: socket.socket | None = sock
        self.call_id: str | None = None
        self.started = 0.0


class Zygote:
    """The zygote's state and main loop. It keeps ``STANDBY_WORKERS`` forked, prepared,
    never-used workers; each call takes one (it serves exactly that call) and a new one is
    forked right after."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        import gc
        import secrets

        from sandboxd.backends.restricted import confine

        self._token = secrets.token_hex
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
        self.program = confine.SeccompProgram.build()
        self.workers: dict[int, _Worker] = {}
        # cgroup limits a standby applies in advance: those of the latest call
        self.preset: tuple[int, float, int] = (256 * 1024 * 1024, 1.0, 64)
        self.standby: list[int] = []
        self.by_id: dict[str, int] = {}
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        cfg["zygote_pid"] = os.getpid()
        cfg["landlock_abi"] = confine.landlock_abi()
        gc.collect()
        gc.freeze()  # the workers' GC then never walks (and copies) the zygote's objects

    def serve(self) -> None:
        self.refill()
        send_msg(self.evt, {"t": "ready", "pid": os.getpid()})
        while True:
            try:
                ready, _, _ = select.select([self.req, self.wake_r], [], [])
            except InterruptedError:
                continue
            if self.wake_r in ready:
                try:
                    while os.read(self.wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                self.reap()
            if self.req in ready:
                try:
                    msg, fds = recv_msg(self.req)
                except (EOFError, ConnectionError):
                    self.shutdown()
                    return
                self.handle(msg, fds)
            self.reap()
            self.refill()

    def refill(self) -> None:
        while len(self.standby) < STANDBY_WORKERS:
            if not self.spawn():
                break

    def spawn(self) -> bool:
        # Warming a standby up (touching the pages a call touches) takes the copy-on-write
        # cost off the call's critical path, but costs CPU: do it only when at most one call
        # is running (a core is free), not when calls saturate the CPUs.
        warm = len(self.workers) - len(self.standby) <= 1
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cgroup = "w" + self._token(8)
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            return False
        if pid == 0:  # the worker
            status = 71
            try:
                ours.close()
                status = _worker(
                    theirs, cgroup, self.cfg, self.layout, self.program, self.preset, warm
                )
            finally:
                os._exit(status)
        theirs.close()
        self.workers[pid] = _Worker(cgroup, ours)
        self.standby.append(pid)
        return True

    def handle(self, msg: dict[str, Any], fds: list[int]) -> None:
        kind = msg.get("t")
        if kind == "run":
            if not fds:
                send_msg(self.evt, {"t": "error", "id": msg.get("id"), "message": "no pipe"})
                return
            for extra in fds[1:]:
                os.close(extra)
            self.assign(msg, fds[0])
        elif kind == "kill":
            pid = self.by_id.get(msg.get("id", ""))
            if pid is not None and pid in self.workers:
                for killer in (os.killpg, os.kill):
                    with contextlib.suppress(OSError):
                        killer(pid, signal.SIGKILL)
        else:
            for fd in fds:
                os.close(fd)

    def assign(self, msg: dict[str, Any], wfd: int) -> None:
        call_id = msg["id"]
        self.preset = (int(msg["memory"]), float(msg["cpus"]), int(msg["pids"]))
        while True:
            if not self.standby and not self.spawn():
                os.close(wfd)
                send_msg(self.evt, {"t": "error", "id": call_id, "message": "fork failed"})
                return
            pid = self.standby.pop(0)
            worker = self.workers.get(pid)
            if worker is None or worker.sock is None:
                continue  # died while on standby
            try:
                data = json.dumps(msg).encode()
                socket.send_fds(worker.sock, [_HEADER.pack(len(data))], [wfd])
                worker.sock.sendall(data)
            except OSError:
                worker.sock.close()
                worker.sock = None
                continue
            break
        os.close(wfd)
        worker.sock.close()
        worker.sock = None
        worker.call_id = call_id
        worker.started = time.perf_counter()
        self.by_id[call_id] = pid
        send_msg(self.evt, {"t": "started", "id": call_id, "pid": pid, "cgroup": worker.cgroup})

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
            if pid in self.standby:
                self.standby.remove(pid)
            if worker.sock is not None:
                worker.sock.close()
            peak, oom = self.layout.stats(worker.cgroup) if self.layout.version else (0, False)
            removed = self.layout.remove(worker.cgroup) if self.layout.version else True
            if worker.call_id is None:
                continue
            self.by_id.pop(worker.call_id, None)
            send_msg(
                self.evt,
                {
                    "t": "exit",
                    "id": worker.call_id,
                    "pid": pid,
                    "cgroup": worker.cgroup,
                    "exit_code": os.waitstatus_to_exitcode(status)
                    if os.WIFEXITED(status)
                    else None,
                    "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                    "wall_ms": int((time.perf_counter() - worker.started) * 1000),
                    "cpu_ms": int((ru.ru_utime + ru.ru_stime) * 1000),
                    "maxrss": int(ru.ru_maxrss) * 1024,
                    "peak_memory": peak,
                    "oom": oom,
                    "cgroup_removed": removed,
                },
            )

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
    Zygote(cfg).serve()
