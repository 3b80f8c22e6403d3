"""sandboxd runner: runs inside a sandbox container and starts a fresh process per call.

Started by the container's init (docker-init / tini) as uid 10001. The daemon listens on a unix
socket in a per-container host directory that is bind-mounted read-only at /run/sandboxd; the
runner connects to it and waits for a request. When one arrives, that connection belongs to
the call, and the runner at once opens a new idle connection for the next call (so concurrent
calls of one session each get their own connection).

Each call gets a *worker* process (its own session and process group, oom_score_adj 1000,
stdin /dev/null, the environment the request names and nothing else): commands are started
with posix_spawn, python code runs in a fork of this interpreter (modules pre-imported, GC
frozen). One select loop relays every worker's stdout/stderr as frames, stops a worker when
the output cap is reached, the pids limit is hit or the daemon hangs up, and finally sends the
exit status, rusage and the cgroup's OOM/pids events.

Wire format (both directions): 1 byte type, 4 bytes big-endian length, payload.
  daemon -> runner  b"R" JSON request
  runner -> daemon  b"o" stdout bytes, b"e" stderr bytes, b"x" JSON exit record

Python only (standard library); runs on the image's python3 (3.11 or 3.12).
"""

# ruff: noqa: SIM105, SIM115  (standalone script: minimal imports, fds managed by hand)
import ast
import builtins
import gc
import io
import json
import os
import select
import signal
import socket
import struct
import sys
import time
import traceback

SOCKET_PATH = os.environ.get("SANDBOXD_RUNNER_SOCKET", "/run/sandboxd/runner.sock")
HEADER = struct.Struct(">cI")
CHUNK = 65536
MAX_REQUEST = 16 * 1024 * 1024


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            return None
        buf += part
    return bytes(buf)


def recv_frame(sock):
    head = _recv_exact(sock, HEADER.size)
    if head is None:
        return None, None
    kind, size = HEADER.unpack(head)
    if size > MAX_REQUEST:
        return None, None
    body = _recv_exact(sock, size)
    if body is None:
        return None, None
    return kind, body


def send_frame(sock, kind, payload):
    sock.sendall(HEADER.pack(kind, len(payload)) + payload)


# ------------------------------------------------------------------ cgroup counters


def _read_key(paths, key):
    for path in paths:
        try:
            with open(path) as fh:
                for line in fh:
                    parts = line.split()
                    if len(parts) == 2 and parts[0] == key:
                        return int(parts[1])
        except (OSError, ValueError):
            continue
    return 0


def _existing(*paths):
    return tuple(p for p in paths if os.path.exists(p))


# found once in the runner; handlers inherit them (cgroup v2 first, then v1)
OOM_FILES = _existing("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
PIDS_FILES = _existing("/sys/fs/cgroup/pids.events", "/sys/fs/cgroup/pids/pids.events")


def cgroup_counters():
    """(oom kills, pids-limit hits) of this container's cgroup (v2 or v1)."""
    return _read_key(OOM_FILES, "oom_kill"), _read_key(PIDS_FILES, "max")


# ------------------------------------------------------------------ the worker (child)


def _user_import(allow, deny):
    real = builtins.__import__

    def guarded(name, globals=None, locals=None, fromlist=(), level=0):
        top = name.split(".")[0]
        if level == 0 and (top in deny or (allow and top not in allow)):
            raise ImportError(f"import of '{top}' is not allowed by the policy")
        return real(name, globals, locals, fromlist, level)

    return guarded


def run_python(req, value_fd):
    """Execute the request's code in this (fresh, forked) interpreter; exit with its status."""
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    sys.stdin = open(os.devnull)
    sys.argv = ["<sandbox>"]
    os.environ.clear()
    os.environ.update(req.get("env") or {})
    sys.path[:] = [p for p in sys.path if not p.startswith("/opt/sandboxd")]
    sys.path.insert(0, os.getcwd())
    code = req.get("code") or ""
    bi = dict(vars(builtins))
    if req.get("imports_allow") or req.get("imports_deny"):
        bi["__import__"] = _user_import(set(req.get("imports_allow") or ()),
                                        set(req.get("imports_deny") or ()))
    namespace = {"__name__": "__main__", "__builtins__": bi}
    status = 0
    value = None
    try:
        tree = ast.parse(code, "<code>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<code>", "exec"), namespace)
        if last is not None:
            value = eval(compile(last, "<code>", "eval"), namespace)
    except SystemExit as exc:
        code_ = exc.code
        status = code_ if isinstance(code_, int) else (0 if code_ is None else 1)
        if code_ is not None and not isinstance(code_, int):
            print(code_, file=sys.stderr)
    except BaseException:
        etype, evalue, tb = sys.exc_info()
        # drop the runner's own frame from the traceback
        lines = traceback.format_exception(etype, evalue, tb.tb_next if tb else None)
        sys.stderr.write("".join(lines))
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    if value is not None and status == 0:
        try:
            record = {"value": value}
            data = json.dumps(record, allow_nan=False).encode()
        except (TypeError, ValueError, RecursionError):
            try:
                data = json.dumps({"value": repr(value)}).encode()
            except Exception:
                data = b'{"value": "<unrepresentable>"}'
        try:
            os.write(value_fd, data[: 1024 * 1024 + 64])
        except OSError:
            pass
    os._exit(status & 0xFF)


def worker(req, out_w, err_w, value_w):
    """In the forked worker: set up fds, session, signals, then exec (command) or run code."""
    try:
        os.setsid()
        try:
            with open("/proc/self/oom_score_adj", "w") as fh:
                fh.write("1000")
        except OSError:
            pass
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        if value_w is None:
            os.closerange(3, 65536)
        else:
            os.closerange(3, value_w)
            os.closerange(value_w + 1, 65536)
        for sig in (signal.SIGPIPE, signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        os.umask(0o022)
        os.chdir(req.get("cwd") or "/workspace")
        env = {str(k): str(v) for k, v in (req.get("env") or {}).items()}
        if req.get("kind") == "python":
            run_python(req, value_w)
        argv = [str(a) for a in req.get("argv") or []]
        if not argv:
            os.write(2, b"sandboxd: empty command\n")
            os._exit(127)
        try:
            os.execvpe(argv[0], argv, env)
        except FileNotFoundError:
            os.write(2, f"{argv[0]}: command not found\n".encode())
            os._exit(127)
        except PermissionError:
            os.write(2, f"{argv[0]}: permission denied\n".encode())
            os._exit(126)
        except OSError as exc:
            os.write(2, f"{argv[0]}: {exc.strerror}\n".encode())
            os._exit(126)
    except BaseException as exc:  # never return into the handler's code
        try:
            os.write(2, f"sandboxd runner: {exc!r}\n".encode())
        finally:
            os._exit(126)


def _resolve(argv0, path):
    if "/" in argv0:
        return argv0
    for d in path.split(":"):
        candidate = os.path.join(d or ".", argv0)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def spawn_command(req, out_w, err_w):
    """Start a command with posix_spawn (no fork of this interpreter: much cheaper).

    Returns None when the request needs the fork path (python code, another cwd, or a
    program that cannot be found - the fork path reports that with the shell's wording).
    """
    if req.get("kind") == "python":
        return None
    cwd = req.get("cwd") or "/workspace"
    if os.path.realpath(cwd) != os.getcwd():
        return None
    argv = [str(a) for a in req.get("argv") or []]
    env = {str(k): str(v) for k, v in (req.get("env") or {}).items()}
    path = _resolve(argv[0], env.get("PATH", "/usr/bin:/bin")) if argv else None
    if path is None:
        return None
    adj = _set_oom_score_adj("1000")  # inherited by the child; ours is restored below
    try:
        return os.posix_spawn(
            path, argv, env,
            file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                          (os.POSIX_SPAWN_DUP2, out_w, 1),
                          (os.POSIX_SPAWN_DUP2, err_w, 2)],
            setsid=True,
            setsigdef=(signal.SIGPIPE, signal.SIGCHLD, signal.SIGINT, signal.SIGTERM),
            setsigmask=(),
        )
    finally:
        if adj:
            _set_oom_score_adj("0")


def _set_oom_score_adj(value):
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write(value)
        return True
    except OSError:
        return False


# ------------------------------------------------------------------ calls


def _group_gone(pgid, wait_s=0.3):
    """True once no process of process group ``pgid`` is left (they were SIGKILLed)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = False
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            # fields: state ppid pgrp ...; zombies are gone as far as resources go
            if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
                left = True
                break
        if not left:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


class Call:
    """One call in flight: its connection, worker process and output pipes."""

    def __init__(self, conn, req):
        self.conn = conn
        self.cfd = conn.fileno()
        self.req = req
        self.limit = int(req.get("output_bytes") or 1024 * 1024)
        self.oom0, self.pids0 = cgroup_counters()
        self.started = time.monotonic()
        self.pid = None
        self.streams = {}
        self.value_r = None
        self.pipes = set()
        self.sent = 0
        self.value_buf = bytearray()
        self.reaped = None  # (status, rusage) once the worker has exited
        self.grace_until = None  # then its leftovers get a moment to flush, not forever
        self.output_limit = False
        self.pids_limit = False
        self.hangup = False

    def start(self):
        """Start the worker: posix_spawn for commands, fork for python code."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        value_w = None
        if self.req.get("kind") == "python":
            self.value_r, value_w = os.pipe()
        self.streams = {out_r: b"o", err_r: b"e"}
        self.pipes = {out_r, err_r} | ({self.value_r} if self.value_r is not None else set())
        for fd in self.pipes:
            os.set_blocking(fd, False)
        try:
            pid = spawn_command(self.req, out_w, err_w)
            if pid is None:
                pid = os.fork()
                if pid == 0:
                    worker(self.req, out_w, err_w, value_w)  # never returns
        finally:
            for fd in (out_w, err_w, value_w):
                if fd is not None:
                    os.close(fd)
        self.pid = pid

    @property
    def stopping(self):
        return self.hangup or self.output_limit or self.pids_limit

    def on_pipe(self, fd):
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:  # a stale readiness report (fd numbers are reused)
            return
        except OSError:
            data = b""
        if not data:
            self.pipes.discard(fd)
            os.close(fd)
            return
        if fd == self.value_r:
            if len(self.value_buf) < 2 * 1024 * 1024:
                self.value_buf += data
            return
        if self.output_limit:
            return
        room = self.limit - self.sent
        if len(data) > room:
            data = data[: max(room, 0)]
            self.output_limit = True
        if data:
            self.sent += len(data)
            try:
                send_frame(self.conn, self.streams[fd], data)
            except OSError:
                self.hangup = True

    def poll(self, now):
        """Reap the worker without blocking; True when the call can be finished."""
        if self.reaped is None:
            try:
                done, status, usage = os.wait4(self.pid, os.WNOHANG)
            except ChildProcessError:
                done, status, usage = self.pid, 0, None
            if done == self.pid:
                self.reaped = (status, usage)
                self.grace_until = now + 0.2
        if self.stopping:
            return True
        return self.reaped is not None and (not self.pipes or now > self.grace_until)

    def finish(self):
        """Stop what is left of the call, report how it ended, release everything."""
        if self.stopping:
            _killpg(self.pid)
        if self.reaped is None:
            _, status, usage = os.wait4(self.pid, 0)
        else:
            status, usage = self.reaped
        _killpg(self.pid)  # anything the worker left behind in its process group (`cmd &`)
        group_gone = _group_gone(self.pid)
        oom1, pids1 = cgroup_counters()
        record = {
            "exit_code": os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "cpu_ms": int((usage.ru_utime + usage.ru_stime) * 1000) if usage else 0,
            "peak_memory_bytes": int(usage.ru_maxrss) * 1024 if usage else 0,
            "wall_ms": int((time.monotonic() - self.started) * 1000),
            "oom": oom1 > self.oom0,
            "pids_limit": self.pids_limit or pids1 > self.pids0,
            "output_limit": self.output_limit,
            "group_gone": group_gone,
        }
        if self.value_buf:
            try:
                record["value"] = json.loads(self.value_buf.decode())["value"]
                record["has_value"] = True
            except (ValueError, KeyError, UnicodeDecodeError):
                pass
        if not self.hangup:
            try:
                send_frame(self.conn, b"x", json.dumps(record).encode())
            except OSError:
                pass
        for fd in self.pipes:
            os.close(fd)
        self.pipes = set()
        self.conn.close()


def _killpg(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


# ------------------------------------------------------------------ the runner (main loop)


def connect():
    deadline = time.monotonic() + 30
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(SOCKET_PATH)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                sys.exit(3)
            time.sleep(0.005)


def _refuse(conn, message, pids_limit=False):
    try:
        send_frame(conn, b"x", json.dumps({"error": message, "pids_limit": pids_limit}).encode())
    except OSError:
        pass
    conn.close()


def _idle():
    conn = connect()
    send_frame(conn, b"h", json.dumps({"pid": os.getpid()}).encode())
    return conn


def main():
    """One process, one select loop: every call's connection, pipes and worker."""
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.umask(0o022)
    # Everything imported so far is shared with every forked worker: keep the garbage
    # collector from touching (and so copying) those pages after each fork.
    gc.collect()
    gc.freeze()
    idle = _idle()
    calls = {}  # connection fd -> Call
    owners = {}  # pipe fd -> Call
    last_pids_check = 0.0
    while True:
        rlist = [idle.fileno(), *calls, *owners]
        try:
            ready, _, _ = select.select(rlist, [], [], 0.05 if calls else None)
        except InterruptedError:
            continue
        for fd in ready:
            if fd == idle.fileno():
                try:
                    kind, body = recv_frame(idle)
                except OSError:
                    kind = None
                if kind is None:  # the daemon closed the idle connection: shut down
                    for call in calls.values():
                        _killpg(call.pid)
                    return 0
                conn, idle = idle, None
                try:
                    call = Call(conn, json.loads(body))
                    call.start()
                except ValueError:
                    conn.close()
                except OSError as exc:
                    for pfd in call.pipes:
                        os.close(pfd)
                    _refuse(conn, f"cannot start the process: {exc.strerror}",
                            exc.errno == 11 or cgroup_counters()[1] > call.pids0)
                else:
                    calls[call.cfd] = call
                    for pfd in call.pipes:
                        owners[pfd] = call
                idle = _idle()  # ready for the next call at once
            elif fd in calls:
                call = calls[fd]
                try:
                    data = call.conn.recv(1, socket.MSG_DONTWAIT)
                except BlockingIOError:  # stale readiness report
                    continue
                except OSError:
                    data = b""
                if not data:  # the daemon hung up (timeout or cancellation): stop now
                    call.hangup = True
            elif fd in owners:
                call = owners[fd]
                call.on_pipe(fd)
                if fd not in call.pipes:
                    del owners[fd]
        now = time.monotonic()
        if calls and now - last_pids_check >= 0.05:
            last_pids_check = now
            pids_now = cgroup_counters()[1]
            for call in calls.values():
                if pids_now > call.pids0:
                    call.pids_limit = True
        for cfd, call in list(calls.items()):
            if call.poll(now):
                for pfd in call.pipes:
                    owners.pop(pfd, None)
                del calls[cfd]
                call.finish()


if __name__ == "__main__":
    sys.exit(main())
