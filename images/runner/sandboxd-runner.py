"""sandboxd runner: runs inside a sandbox container and forks a fresh process per call.

Started by the container's init (docker-init / tini) as uid 10001. The daemon listens on a unix
socket in a per-container host directory that is bind-mounted read-only at /run/sandboxd; the
runner connects to it and waits for a request. When one arrives it forks a *handler* that owns
that connection for the whole call, and immediately opens a new idle connection for the next
call (so concurrent calls of one session each get their own connection).

The handler forks the *worker* (own process group, oom_score_adj 1000, stdin /dev/null, the
environment the request names and nothing else), relays its stdout/stderr as frames, stops it
when the output cap is reached, the pids limit is hit or the daemon hangs up, and finally sends
the exit status, rusage and the cgroup's OOM/pids events.

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


# ------------------------------------------------------------------ the worker (grandchild)


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


# ------------------------------------------------------------------ the handler (child)


def _group_gone(pgid, wait_s=1.0):
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


def handle(conn, req):
    """Own one call: fork the worker, relay its output, report how it ended."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    oom0, pids0 = cgroup_counters()
    limit = int(req.get("output_bytes") or 1024 * 1024)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    value_r = value_w = None
    if req.get("kind") == "python":
        value_r, value_w = os.pipe()
    started = time.monotonic()
    try:
        pid = spawn_command(req, out_w, err_w)
        if pid is None:
            pid = os.fork()
    except OSError as exc:
        _, pids1 = cgroup_counters()
        send_frame(conn, b"x", json.dumps({
            "error": f"cannot start the process: {exc.strerror}",
            "pids_limit": pids1 > pids0,
        }).encode())
        os._exit(0)
    if pid == 0:
        conn.close()
        for fd in (out_r, err_r, value_r):
            if fd is not None:
                os.close(fd)
        worker(req, out_w, err_w, value_w)
    for fd in (out_w, err_w, value_w):
        if fd is not None:
            os.close(fd)

    sent = 0
    output_limit = False
    pids_limit = False
    hangup = False
    value_buf = bytearray()
    streams = {out_r: b"o", err_r: b"e"}
    pipes = {out_r, err_r} | ({value_r} if value_r is not None else set())
    cfd = conn.fileno()
    last_check = time.monotonic()

    def stop():
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass

    reaped = None  # (status, rusage) once the worker has exited
    grace_until = None  # then its leftovers get a moment to flush, not forever
    while pipes and not (hangup or output_limit or pids_limit):
        if grace_until is not None and time.monotonic() > grace_until:
            break
        try:
            ready, _, _ = select.select([*pipes, cfd], [], [], 0.05)
        except InterruptedError:
            continue
        for fd in ready:
            if fd == cfd:
                try:
                    data = conn.recv(1)
                except OSError:
                    data = b""
                if not data:  # the daemon hung up (timeout or cancellation): stop now
                    hangup = True
                continue
            try:
                data = os.read(fd, CHUNK)
            except OSError:
                data = b""
            if not data:
                pipes.discard(fd)
                os.close(fd)
                continue
            if fd == value_r:
                if len(value_buf) < 2 * 1024 * 1024:
                    value_buf += data
                continue
            room = limit - sent
            if len(data) > room:
                data = data[: max(room, 0)]
                output_limit = True
            if data:
                sent += len(data)
                try:
                    send_frame(conn, streams[fd], data)
                except OSError:
                    hangup = True
        now = time.monotonic()
        if reaped is None and (not ready or now - last_check >= 0.05):
            done, wstatus, wusage = os.wait4(pid, os.WNOHANG)
            if done == pid:
                reaped = (wstatus, wusage)
                grace_until = now + 0.2
        if now - last_check >= 0.05:
            last_check = now
            if cgroup_counters()[1] > pids0:
                pids_limit = True
    if hangup or output_limit or pids_limit:
        stop()

    if reaped is None:
        _, status, usage = os.wait4(pid, 0)
    else:
        status, usage = reaped
    stop()  # anything the worker left behind in its process group (e.g. `cmd &`)
    group_gone = _group_gone(pid)
    oom1, pids1 = cgroup_counters()
    record = {
        "exit_code": os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "cpu_ms": int((usage.ru_utime + usage.ru_stime) * 1000),
        "peak_memory_bytes": int(usage.ru_maxrss) * 1024,
        "wall_ms": int((time.monotonic() - started) * 1000),
        "oom": oom1 > oom0,
        "pids_limit": pids_limit or pids1 > pids0,
        "output_limit": output_limit,
        "group_gone": group_gone,
    }
    if value_buf:
        try:
            record["value"] = json.loads(value_buf.decode())["value"]
            record["has_value"] = True
        except (ValueError, KeyError, UnicodeDecodeError):
            pass
    if not hangup:
        try:
            send_frame(conn, b"x", json.dumps(record).encode())
        except OSError:
            pass
    os._exit(0)


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


def main():
    # Children are reaped automatically; handlers restore SIGCHLD for their own worker.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.umask(0o022)
    # Everything imported so far is shared with every forked handler and worker: keep the
    # garbage collector from touching (and so copying) those pages after each fork.
    gc.collect()
    gc.freeze()
    while True:
        conn = connect()
        try:
            send_frame(conn, b"h", json.dumps({"pid": os.getpid()}).encode())
            kind, body = recv_frame(conn)
        except OSError:
            kind = None
        if kind is None:  # daemon closed the idle connection: it is shutting us down
            conn.close()
            return 0
        try:
            req = json.loads(body)
        except ValueError:
            conn.close()
            continue
        try:
            pid = os.fork()
        except OSError as exc:
            try:
                send_frame(conn, b"x", json.dumps({
                    "error": f"cannot start the call: {exc.strerror}",
                    "pids_limit": exc.errno == 11,
                }).encode())
            except OSError:
                pass
            conn.close()
            time.sleep(0.01)
            continue
        if pid == 0:
            try:
                handle(conn, req)
            finally:
                os._exit(0)
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
