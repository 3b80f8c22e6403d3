"""sandboxd runner: runs inside a sandbox container and starts a fresh process per call.

Started by the container's init (docker-init / tini) as uid 10001, before any user code
exists. It makes itself non-dumpable (same-uid code cannot read its memory or fds through
/proc, nor ptrace it), reads the 32-byte key the daemon left in /run/sandboxd/key, connects
once to /run/sandboxd/runner.sock and says hello with the key. The daemon then removes the
socket and the key: that one channel carries every call of the container, multiplexed by call
id (frames of sandboxd/protocol/wire.py: the image build copies the protocol package next to
this file). The import, path and output rules are sandboxd/protocol/rules.py, from the same
package: one definition.

Each call gets a *worker* process (its own session and process group, oom_score_adj 1000,
stdin /dev/null, the environment the request names and nothing else): a command plan that is
one plain program is started with posix_spawn; any other plan (pipes, ``&&``/``||``/``;``,
redirects, an exec restriction) runs in a fork that executes it (see "command plans": never
through a shell); python code runs in a fork of this interpreter (modules pre-imported, GC
frozen). One select loop relays every worker's stdout/stderr as frames, stops a worker when
the output cap is reached, the pids limit is hit or the daemon says stop, and finally sends
the exit status, rusage and the cgroup's OOM/pids events.

A session's python calls (``"kernel": true``) run instead in the container's *kernel*: one
persistent interpreter forked like a worker and kept between calls, so that their globals
persist (see "the session kernel" below); ``{"kind": "kernel_stop"}`` ends it. A kernel
call ends only once the runner has proven from /proc that the kernel is idle, and the daemon
interrupts a kernel call (SIGINT: a KeyboardInterrupt in its code) before it kills it.

  daemon -> runner  b"R" JSON request (new call id), b"K" stop that call, b"I" interrupt that
                    call (a kernel call: see "the session kernel"; other calls ignore it)
  runner -> daemon  b"h" the key (call 0, once), b"o" stdout bytes, b"e" stderr bytes,
                    b"d" a display item (sandboxd/protocol/display.py), b"x" JSON exit record (ends
                    the call)

Display items: python code gets a ``display(*objs)`` builtin (IPython's rich-repr
conventions; a cell's rich last value and the matplotlib figures it leaves open, or shows
with ``plt.show()``, are displayed too). The user's process writes each item as a ``d``
frame on a pipe of its own; the runner reads that pipe with a bounded decoder (the call's
caps) and relays the frames; the daemon checks every item again (sandboxd/outputs.py).

Python only (standard library); runs on the image's python3 (3.11 or 3.12).
"""

# ruff: noqa: SIM105, SIM115  (standalone script: minimal imports, fds managed by hand)
import _signal  # pthread_sigmask without signal's enum members (tens of microseconds a call)
import ast
import builtins
import ctypes
import fcntl
import gc
import importlib.util
import io
import json
import linecache
import marshal
import os
import select
import signal
import socket
import struct
import sys
import time
import traceback

SOCKET_PATH = os.environ.get("SANDBOXD_RUNNER_SOCKET", "/run/sandboxd/runner.sock")
KEY_PATH = os.path.join(os.path.dirname(SOCKET_PATH), "key")
KEY_BYTES = 32
MAX_REQUEST = 64 * 1024 * 1024
PR_SET_DUMPABLE = 4


def _load_shared(filename, name):
    """A sandboxd module installed next to this file (``-I``: not on sys.path)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), filename)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# sandboxd/protocol/wire.py: the frame protocol
wire = _load_shared("protocol/wire.py", "sandboxd_wire")
# sandboxd/protocol/rules.py: the import, workspace path and output rules (the daemon's own)
rules = _load_shared("protocol/rules.py", "sandboxd_rules")
# sandboxd/protocol/display.py: what a display item is (MIME types, caps, IPython's reprs)
display_rules = _load_shared("protocol/display.py", "sandboxd_display")
CHUNK = wire.READ_BYTES  # the daemon refuses bigger output frames


def site_dirs():
    """The image's site-packages directories, which ``-S`` leaves out: what an image installs
    (numpy, pandas, ... in sandboxd/datascience) must be importable. Appended after the
    standard library (nothing there can shadow it) and without running their .pth files."""
    import site  # under -S, importing site does not run site.main()

    return [p for p in site.getsitepackages() if os.path.isdir(p) and p not in sys.path]


sys.path.extend(site_dirs())
_libc = ctypes.CDLL(None, use_errno=True)


def set_dumpable(flag):
    """prctl(PR_SET_DUMPABLE): 0 keeps same-uid processes out of our /proc and ptrace."""
    return _libc.prctl(PR_SET_DUMPABLE, flag, 0, 0, 0) == 0


def send_frame(sock, kind, payload, call=0):
    sock.sendall(wire.encode(kind, payload, call))


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


def _user_import(allow, deny, after=None):
    """``__import__`` for user code: the policy's imports rule (sandboxd/protocol/rules.py);
    ``after()`` runs after each import (it hooks matplotlib's ``show``)."""
    real = builtins.__import__

    def guarded(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0:
            names = tuple(f for f in fromlist or () if isinstance(f, str))
            admitted, _ = rules.import_verdict(str(name), allow, deny, names)
            if not admitted:
                raise ImportError(f"import of '{name}' is not allowed by the policy")
        module = real(name, globals, locals, fromlist, level)
        if after is not None:
            after()
        return module

    return guarded


class CellState:
    """What a session kernel's SIGINT handler needs to know (see :func:`interrupt_user_code`);
    one per process (a forked kernel has its own copy)."""

    running = False  # the user's code runs now
    emitting = False  # a display frame is being written: an interrupt waits until it is whole
    pending = False  # an interrupt came while a frame was being written
    message = None  # the last cell's exception line ("ZeroDivisionError: division by zero")


CELL = CellState()


def interrupt_user_code(signum=None, frame=None, cell=CELL):
    """SIGINT in a session kernel: a ``KeyboardInterrupt`` in the user's code while it runs -
    deferred while a display frame is being written, so that the display pipe never carries
    half a frame (:func:`after_emit` raises it then) - and nothing once the code has ended
    (the call is over: the interrupt came too late)."""
    if cell.running and not cell.emitting:
        raise KeyboardInterrupt
    cell.pending = cell.running


def after_emit(cell=CELL):
    """Raise the interrupt that came while a frame was being written (see above)."""
    if cell.pending and cell.running and not cell.emitting:
        cell.pending = False
        raise KeyboardInterrupt


_INTERRUPT_FRAMES = frozenset({(__file__, "interrupt_user_code"), (__file__, "after_emit")})


_FIONREAD = 0x541B  # Linux: bytes in a pipe (either end)
DISPLAY_READ_WAIT_S = 2.0  # how long display() waits for the runner to read its frame


def _frame_read(fd, ioctl=fcntl.ioctl, monotonic=time.monotonic, sleep=time.sleep,
                from_bytes=int.from_bytes, order=sys.byteorder):
    """Wait (bounded) until the runner has read everything on the display pipe ``fd``: it
    relays the stdout/stderr written before an item first (:meth:`Call.drain_text`), so
    output written after ``display()`` returns comes after the item (issue 29)."""
    until, pause = monotonic() + DISPLAY_READ_WAIT_S, 0.0001
    try:
        while from_bytes(ioctl(fd, _FIONREAD, bytes(4)), order) and monotonic() < until:
            sleep(pause)
            pause = min(pause * 2, 0.005)
    except OSError:
        pass


def _user_display(fd, caps, write=os.write, pack=wire.HEADER.pack, memoryview=memoryview,
                  cell=CELL, after_emit=after_emit, frame_read=_frame_read):
    """The user's ``display(*objs)``: each object's mime bundle as one ``d`` frame on ``fd``
    (cut or counted by ``caps``: sandboxd/protocol/display.py), after flushing stdout and
    stderr, and once the runner has read it, back to the caller (so prints keep their
    place around it). Once the runner stops reading (the call's count is reached, or it
    refused a frame), further items are dropped. A kernel's interrupt waits until a frame is
    written whole."""
    sent = [0]

    def display(*objs, **kwargs):
        if kwargs:
            raise TypeError("display() takes no keyword arguments")
        for obj in objs:
            if sent[0] > caps.count:  # the daemon keeps one note past the count
                return
            payload = display_rules.encode_item(display_rules.mime_bundle(obj), caps)
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            view = memoryview(pack(b"d", 0, len(payload)) + payload)
            cell.emitting = True
            try:
                while view:
                    view = view[write(fd, view):]
                sent[0] += 1
            except OSError:
                sent[0] = caps.count + 1
            finally:
                cell.emitting = False
            after_emit()
            if sent[0] <= caps.count:
                frame_read(fd)

    return display


def _show_figures(display):
    """Display every open matplotlib figure and close them all (a cell's end, ``show()``)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        nums = list(plt.get_fignums())
    except Exception:
        return
    for num in nums:
        try:
            display(plt.figure(num))
        except Exception:
            pass
    try:
        plt.close("all")
    except Exception:
        pass


def _hook_pyplot(display):
    """Make ``matplotlib.pyplot.show()`` display the open figures (once it is imported)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or getattr(plt.show, "_sandboxd_display", None) is display:
        return

    def show(*args, **kwargs):
        _show_figures(display)

    show._sandboxd_display = display
    try:
        plt.show = show
    except Exception:
        pass


def _display_tools(req, fd):
    """``(display, after_import)`` for a python call whose display pipe is ``fd``."""
    caps = display_rules.DisplayCaps(**(req.get("display") or {}))
    display = _user_display(fd, caps)
    return display, (lambda: _hook_pyplot(display))


MAX_VALUE_JSON = 1024 * 1024 + 64  # the value's JSON text, beyond which it is dropped
MAX_MESSAGE = 1000  # the exception line a failed cell reports as the result's message


def _user_streams():
    """The user's stdin (/dev/null), stdout and stderr (fds 0-2, written through)."""
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    sys.stdin = open(os.devnull)
    sys.argv = ["<sandbox>"]


def _user_environment(req):
    os.environ.clear()
    os.environ.update(req.get("env") or {})
    sys.path[:] = [p for p in sys.path if not p.startswith("/opt/sandboxd")]
    sys.path.insert(0, os.getcwd())


def _user_builtins(req, display=None, after_import=None):
    """A copy of the builtins with the policy's import rule (an empty allow list admits
    nothing: default deny, as in the policy engine) and ``display``."""
    bi = dict(vars(builtins))
    bi["__import__"] = _user_import(list(req.get("imports_allow") or ()),
                                    list(req.get("imports_deny") or ()), after_import)
    if display is not None:
        bi["display"] = display
    return bi


def execute(code, namespace, display=None, cell=CELL):
    """Run ``code`` in ``namespace`` as a cell: (exit status, value of a last expression).
    With ``display``: a rich last value (a DataFrame, a figure) is displayed, and so are the
    matplotlib figures the cell leaves open. ``cell.running`` says when user code runs (a
    kernel's interrupt lands only then)."""
    status = 0
    value = None
    cell.message = None
    if display is not None:
        _hook_pyplot(display)  # pyplot imported by an earlier cell of a kernel
    # the cell's source for its traceback's lines, as the restricted backend shows them
    linecache.cache["<code>"] = (len(code), None, code.splitlines(True), "<code>")
    try:
        try:
            cell.running, cell.pending = True, False
            tree = ast.parse(code, "<code>", "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, "<code>", "exec"), namespace)
            if last is not None:
                value = eval(compile(last, "<code>", "eval"), namespace)
        finally:
            cell.running = False
    except SystemExit as exc:
        code_ = exc.code
        status = code_ if isinstance(code_, int) else (0 if code_ is None else 1)
        if code_ is not None and not isinstance(code_, int):
            print(code_, file=sys.stderr)
        cell.message = "SystemExit" if status & 0xFF else None
    except BaseException:
        etype, evalue, tb = sys.exc_info()
        status = 1
        try:
            cell.message = etype.__name__
            cell.message = "".join(
                traceback.format_exception_only(etype, evalue)).strip()[:MAX_MESSAGE]
        except BaseException:
            pass
        try:
            # drop the runner's own frame from the traceback (and an interrupt's handler)
            report = traceback.TracebackException(etype, evalue, tb.tb_next if tb else None)
            if issubclass(etype, KeyboardInterrupt):
                while report.stack and (report.stack[-1].filename,
                                        report.stack[-1].name) in _INTERRUPT_FRAMES:
                    report.stack.pop()
            sys.stderr.write("".join(report.format()))
        except BaseException:  # the cell broke what formatting needs (builtins.len = ...)
            try:
                os.write(2, (etype.__name__ + " (its traceback could not be formatted)\n")
                         .encode("utf-8", "replace"))
            except BaseException:
                pass
    if display is not None:
        try:
            try:
                cell.running = True
                if status == 0 and display_rules.has_rich_repr(value):
                    display(value)
                _show_figures(display)
            finally:
                cell.running = False
        except BaseException:  # an exception of the user's repr, an interrupt
            pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    return status & 0xFF, value


def value_json(value, message=None, dumps=json.dumps, repr=repr,
               value_repr=display_rules.value_repr):
    """``{"value": ..., "value_repr": ...}`` as JSON bytes (the value a repr when not
    JSON-safe; ``value_repr`` Python's repr when JSON would change it: a tuple), cut at the
    cap; ``{"message": ...}`` (the exception line) for a failed cell."""
    if value is None:
        return dumps({"message": message}).encode() if message else b""
    try:
        data = dumps({"value": value}, allow_nan=False).encode()
        shown = value_repr(value)
        if shown is not None:
            data = dumps({"value": value, "value_repr": shown}, allow_nan=False).encode()
            if len(data) > MAX_VALUE_JSON:  # the repr must not cost the value
                data = dumps({"value": value}, allow_nan=False).encode()
    except (TypeError, ValueError, RecursionError):
        try:
            data = dumps({"value": repr(value)}).encode()
        except Exception:
            data = b'{"value": "<unrepresentable>"}'
    return data[:MAX_VALUE_JSON]


def answer_fields(record, data):
    """Put what a worker or the kernel reported (:func:`value_json`) into the exit record."""
    try:
        doc = json.loads(bytes(data).decode())
    except (ValueError, UnicodeDecodeError):
        return
    if not isinstance(doc, dict):
        return
    if "value" in doc:
        record["value"], record["has_value"] = doc["value"], True
    if isinstance(doc.get("value_repr"), str):
        record["value_repr"] = doc["value_repr"]
    if isinstance(doc.get("message"), str):
        record["message"] = doc["message"][:MAX_MESSAGE]


def run_python(req, value_fd, display_fd):
    """Execute the request's code in this (fresh, forked) interpreter; exit with its status."""
    _user_streams()
    _user_environment(req)
    display, after_import = _display_tools(req, display_fd)
    namespace = {"__name__": "__main__",
                 "__builtins__": _user_builtins(req, display, after_import)}
    status, value = execute(req.get("code") or "", namespace, display)
    data = value_json(value if status == 0 else None, CELL.message)
    if data:
        try:
            os.write(value_fd, data)
        except OSError:
            pass
    os._exit(status)


def _close_fds_except(keep):
    """Close every fd from 3 up but those in ``keep``."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


def worker(req, out_w, err_w, value_w, display_w):
    """In the forked worker: set up fds, session, signals, then exec (command) or run code."""
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        _close_fds_except({fd for fd in (value_w, display_w) if fd is not None})
        # only now (the channel's fd is closed) may the user's own process be dumpable
        set_dumpable(1)
        try:
            with open("/proc/self/oom_score_adj", "w") as fh:
                fh.write("1000")
        except OSError:
            pass
        for sig in (signal.SIGPIPE, signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        os.umask(0o022)
        os.chdir(req.get("cwd") or "/workspace")
        env = {str(k): str(v) for k, v in (req.get("env") or {}).items()}
        if req.get("kind") == "python":
            run_python(req, value_w, display_w)
        os._exit(run_plan(req.get("plan") or {}, env) & 0xFF)
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
    """Start a plan that is one plain command with posix_spawn (no fork of this interpreter:
    much cheaper).

    Returns None when the request needs the fork path (python code, a plan with pipes,
    sequencing, redirects or an exec restriction, another cwd, or a program that cannot be
    found - the fork path reports that with the shell's wording).
    """
    if req.get("kind") == "python":
        return None
    cwd = req.get("cwd") or "/workspace"
    if os.path.realpath(cwd) != os.getcwd():
        return None
    env = {str(k): str(v) for k, v in (req.get("env") or {}).items()}
    argv = simple_command(req.get("plan") or {}, env)
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


def _open_oom_score_adj():
    """Opened while still dumpable: a non-dumpable process's /proc/self files are root's."""
    try:
        return os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return None


OOM_ADJ_FD = _open_oom_score_adj()


def _set_oom_score_adj(value):
    if OOM_ADJ_FD is None:
        return False
    try:
        os.write(OOM_ADJ_FD, value.encode())
        return True
    except OSError:
        return False


# ------------------------------------------------------------------ command plans
#
# A command tool's request carries a plan (sandboxd.models.Plan), built by the daemon's policy
# engine from the parsed command line and checked program by program. It is executed here as
# it is, by the functions below: no shell ever sees the command line, so nothing runs that the
# policy did not check. Pipelines run left to right; ``run_if`` skips one unless the status of
# the last one that ran says so (``&&``: 0, ``||``: not 0); a pipeline's status is its last
# command's (128 + signal when killed). Redirects are applied in order; files are opened inside
# the workspace without following symlinks. Failures are reported the way /bin/sh (dash) does:
# 127 for a program that is not found, 126 when it cannot be executed, 2 for a redirect.

_OPEN_FLAGS = {"read": os.O_RDONLY, "write": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
               "append": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
               "readwrite": os.O_RDWR | os.O_CREAT}


def simple_command(plan, env):
    """The argv of a plan that is one command without redirects or exec restriction (its
    environment is added to ``env``), else None."""
    pipelines = plan.get("pipelines") or []
    if len(pipelines) != 1 or len(pipelines[0].get("commands") or []) != 1:
        return None
    cmd = pipelines[0]["commands"][0]
    if cmd.get("redirects") or cmd.get("exec_only") is not None:
        return None
    env.update({str(k): str(v) for k, v in (cmd.get("env") or {}).items()})
    return [str(a) for a in cmd.get("argv") or []] or None


def run_plan(plan, env):
    """Execute every pipeline of ``plan`` (in the worker); returns the exit status."""
    status = 0
    for pipeline in plan.get("pipelines") or []:
        run_if = pipeline.get("run_if", "always")
        if (run_if == "ok" and status != 0) or (run_if == "failed" and status == 0):
            continue
        status = _run_pipeline(pipeline.get("commands") or [], env)
    return status


def _run_pipeline(commands, env):
    pids = []
    stdin = None
    for i, cmd in enumerate(commands):
        last = i == len(commands) - 1
        r, w = (None, None) if last else os.pipe()
        try:
            pids.append(_start_command(cmd, env, stdin, w, r))
        finally:
            for fd in (stdin, w):
                if fd is not None:
                    os.close(fd)
        stdin = r
    status = 0
    for pid in pids:
        _, wstatus = os.waitpid(pid, 0)
        status = (os.WEXITSTATUS(wstatus) if os.WIFEXITED(wstatus)
                  else 128 + os.WTERMSIG(wstatus))
    return status


def _start_command(cmd, env, stdin, stdout, other_end):
    """Fork and exec one planned command; returns its pid."""
    pid = os.fork()
    if pid:
        return pid
    try:
        if stdin is not None:
            os.dup2(stdin, 0)
        if stdout is not None:
            os.dup2(stdout, 1)
        for fd in (stdin, stdout, other_end):
            if fd is not None and fd > 2:
                os.close(fd)
        # the worker's stderr, for our own messages; above the descriptors a plan can name
        err = fcntl.fcntl(2, fcntl.F_DUPFD_CLOEXEC, 10)
        argv = [str(a) for a in cmd.get("argv") or []]
        if not argv:
            os._exit(0)
        for redirect in cmd.get("redirects") or []:
            problem = _redirect(redirect)
            if problem:
                os.write(err, f"sandboxd: {problem}\n".encode(errors="backslashreplace"))
                os._exit(2)
        child_env = dict(env)
        child_env.update({str(k): str(v) for k, v in (cmd.get("env") or {}).items()})
        exec_only = cmd.get("exec_only")
        if exec_only is not None:
            problem = restrict_exec(exec_only, child_env.get("PATH", "/usr/bin:/bin"))
            if problem:
                os.write(err, f"sandboxd: {argv[0]}: not started: {problem}\n".encode())
                os._exit(126)
        try:
            os.execvpe(argv[0], argv, child_env)
        except FileNotFoundError:
            os.write(err, f"{argv[0]}: command not found\n".encode(errors="backslashreplace"))
            os._exit(127)
        except PermissionError:
            os.write(err, f"{argv[0]}: permission denied\n".encode(errors="backslashreplace"))
            os._exit(126)
        except OSError as exc:
            os.write(err, f"{argv[0]}: {exc.strerror}\n".encode(errors="backslashreplace"))
            os._exit(126)
    except BaseException as exc:  # never return into the worker's loop
        try:
            os.write(2, f"sandboxd runner: {exc!r}\n".encode(errors="backslashreplace"))
        finally:
            os._exit(126)


def _redirect(redirect):
    """Perform one redirect in the child; returns a message when it failed."""
    fd = int(redirect["fd"])
    mode = redirect["mode"]
    if mode == "close":
        try:
            os.close(fd)
        except OSError:
            pass
        return None
    if mode == "dup":
        source = int(redirect["dup"])
        try:
            if source == fd:
                os.fstat(fd)  # `n>&n`: only needs to be open
            os.dup2(source, fd)
        except OSError:
            return f"{source}: Bad file descriptor"
        return None
    path = str(redirect["path"])
    try:
        opened = _open_in_workspace(path, _OPEN_FLAGS[mode])
    except OSError as exc:
        why = ("it is or passes through a symbolic link, which is not followed"
               if exc.errno in (40, 20) else exc.strerror)  # ELOOP, ENOTDIR
        return f"cannot open {path}: {why}"
    if opened != fd:
        os.dup2(opened, fd)
        os.close(opened)
    else:
        os.set_inheritable(fd, True)
    return None


def _open_in_workspace(path, flags):
    """Open a workspace-relative path (or /dev/null) from the current directory, one component
    at a time, never following a symlink."""
    if path == "/dev/null":
        return os.open(path, flags & ~os.O_CREAT & ~os.O_TRUNC)
    try:  # the daemon sends normalised paths; the same rule holds here (sandboxd/protocol/rules.py)
        norm = rules.normalise_path(path)
    except rules.PathRefused:
        raise OSError(22, "not a workspace path") from None
    parts = rules.path_components(norm)
    if not parts:
        raise OSError(21, "the workspace itself is not a file")
    dfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=dfd)
            os.close(dfd)
            dfd = nxt
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NOCTTY, 0o666, dir_fd=dfd)
    finally:
        os.close(dfd)


def restrict_exec(allowed, path):
    """From now on, let this process (and what it starts) execute only the programs named in
    ``allowed`` (names looked up on ``path``) and files beneath its absolute directories, plus
    their ELF interpreters: a Landlock ruleset that handles only EXECUTE. Returns a message
    when the kernel cannot enforce it (the caller then refuses to run the command)."""
    libc = ctypes.CDLL(None, use_errno=True)
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    targets = []
    for entry in allowed:
        entry = str(entry)
        if entry.startswith("/"):
            if os.path.exists(entry):
                targets.append(entry)
            continue
        found = _resolve(entry, path)
        if found is not None:
            targets.append(found)
            interp = _elf_interpreter(found)
            if interp:
                targets.append(interp)
    abi = syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # create_ruleset VERSION
    if abi < 1:
        return (f"the kernel cannot confine it to {', '.join(map(str, allowed))} "
                f"(Landlock: {os.strerror(ctypes.get_errno())})")
    attr = ctypes.c_uint64(1)  # handled_access_fs = EXECUTE
    ruleset = syscall(444, ctypes.byref(attr), ctypes.c_size_t(8), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"Landlock: {os.strerror(ctypes.get_errno())}"

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    try:
        for target in targets:
            tfd = os.open(target, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = PathBeneath(1, tfd)
                if syscall(445, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule),
                           ctypes.c_uint32(0)) != 0:
                    return f"Landlock rule for {target}: {os.strerror(ctypes.get_errno())}"
            finally:
                os.close(tfd)
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            return f"no_new_privs: {os.strerror(ctypes.get_errno())}"
        if syscall(446, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return f"Landlock: {os.strerror(ctypes.get_errno())}"
    finally:
        os.close(ruleset)
    return None


def _elf_interpreter(path):
    """The PT_INTERP path of an ELF executable (its dynamic loader), or None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if head[:4] != b"\x7fELF" or head[4] not in (1, 2):
                return None
            end = "<" if head[5] == 1 else ">"
            if head[4] == 2:
                (phoff,) = struct.unpack_from(end + "Q", head, 32)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
            else:
                (phoff,) = struct.unpack_from(end + "I", head, 28)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 42)
            for i in range(min(phnum, 64)):
                fh.seek(phoff + i * phentsize)
                ph = fh.read(phentsize)
                if len(ph) < 8 or struct.unpack_from(end + "I", ph, 0)[0] != 3:  # PT_INTERP
                    continue
                if head[4] == 2:
                    offset, size = struct.unpack_from(end + "Q", ph, 8)[0], struct.unpack_from(
                        end + "Q", ph, 32)[0]
                else:
                    offset, size = struct.unpack_from(end + "I", ph, 4)[0], struct.unpack_from(
                        end + "I", ph, 16)[0]
                fh.seek(offset)
                return fh.read(min(size, 4096)).rstrip(b"\0").decode() or None
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


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
    """One call in flight: its id on the channel, worker process and output pipes."""

    wake = None  # when poll() must look again, sooner than the loop's usual tick (monotonic)

    def __init__(self, chan, cid, req):
        self.chan = chan
        self.cid = cid
        self.req = req
        self.budget = rules.OutputBudget(int(req.get("output_bytes") or 1024 * 1024))
        self.oom0, self.pids0 = cgroup_counters()
        self.started = time.monotonic()
        self.pid = None
        self.streams = {}
        self.value_r = None
        self.pipes = set()
        self.value_buf = bytearray()
        self.reaped = None  # (status, rusage) once the worker has exited
        self.grace_until = None  # then its leftovers get a moment to flush, not forever
        self.output_limit = False
        self.pids_limit = False
        self.hangup = False
        caps = display_rules.DisplayCaps(**(req.get("display") or {}))
        # the user's display frames: bounded by the call's caps (the daemon checks each item)
        self.displays = wire.Decoder({b"d": (2, caps.frame_bytes)}, max_frames=caps.count + 1)
        self.display_error = None

    def start(self):
        """Start the worker: posix_spawn for commands, fork for python code."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        value_w = display_w = None
        self.streams = {out_r: b"o", err_r: b"e"}
        if self.req.get("kind") == "python":
            self.value_r, value_w = os.pipe()
            display_r, display_w = os.pipe()
            self.streams[display_r] = b"d"
        self.pipes = set(self.streams) | ({self.value_r} if self.value_r is not None else set())
        for fd in self.pipes:
            os.set_blocking(fd, False)
        try:
            pid = spawn_command(self.req, out_w, err_w)
            if pid is None:
                pid = os.fork()
                if pid == 0:
                    worker(self.req, out_w, err_w, value_w, display_w)  # never returns
        finally:
            for fd in (out_w, err_w, value_w, display_w):
                if fd is not None:
                    os.close(fd)
        self.pid = pid

    @property
    def stopping(self):
        return self.hangup or self.output_limit or self.pids_limit

    def interrupt(self, now):
        """``I``: only a kernel call is interrupted (a one-shot call is stopped with ``K``)."""

    def on_pipe(self, fd):
        if self.streams.get(fd) == b"d":
            self.drain_text()  # what was printed before the item goes first (issue 29)
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
        if self.streams[fd] == b"d":
            if not self.relay_display(data):
                self.pipes.discard(fd)
                os.close(fd)  # the user's next display() gets EPIPE
            return
        if self.output_limit:
            return
        # one budget for stdout and stderr together (sandboxd/protocol/rules.py)
        data = data[: self.budget.take(len(data))]
        self.output_limit = self.budget.exceeded
        if data:
            try:
                send_frame(self.chan, self.streams[fd], data, self.cid)
            except OSError:
                self.hangup = True

    def drain_text(self):
        """Relay what the stdout and stderr pipes hold now (bounded): the user's display()
        flushed them before writing its item, and waits until the item is read."""
        for fd in [f for f, kind in self.streams.items() if kind != b"d"]:
            for _ in range(64):
                if fd not in self.pipes or not select.select([fd], [], [], 0)[0]:
                    break
                self.on_pipe(fd)

    def relay_display(self, data):
        """Relay the user's display frames; False once they broke the bounds (the call then
        reports an error, and nothing more is read)."""
        if self.display_error is not None or self.hangup:
            return False
        try:
            frames = self.displays.feed(data)
        except wire.ProtocolError as exc:
            self.display_error = f"display(): {exc}"
            return False
        for frame in frames:
            try:
                send_frame(self.chan, b"d", frame.payload, self.cid)
            except OSError:
                self.hangup = True
                return False
        return True

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
        if self.display_error:
            record["error"] = self.display_error
        if self.value_buf:
            answer_fields(record, self.value_buf)
        if not self.hangup:
            try:
                send_frame(self.chan, b"x", json.dumps(record).encode(), self.cid)
            except OSError:
                pass
        for fd in self.pipes:
            os.close(fd)
        self.pipes = set()


def _killpg(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


# ------------------------------------------------------------------ the session kernel
#
# A python request with ``"kernel": true`` (a session's call) runs in the container's kernel:
# one persistent interpreter, forked from this runner like a worker (its own session and
# process group, oom_score_adj 1000, the request's environment, dumpable only after every
# inherited fd but its own pipes is closed), started by the first such call and kept until
# it dies, a call of it hits a limit or is stopped, or a ``kernel_stop`` request. Its globals
# persist between calls; one call at a time. The runner writes it length-prefixed requests
# (marshal) on a pipe; it answers each with one ``v`` frame (sandboxd/protocol/wire.py: exit status
# byte + the value's JSON) on another, read with a bounded decoder: the kernel is user code,
# its answers are hostile. Its stdout/stderr and its display frames are three persistent
# pipes, relayed under the call's output budget and display caps while a call runs and
# discarded between calls. After each call the processes it left in the kernel's process
# group are killed.
#
# The end of a call cannot be forged. A ``v`` answer is the kernel's own word, and user code
# in the kernel can write one and run on. So the runner ends a call (sends its exit record)
# only once it has proven from outside, in /proc and never from the kernel's words, that the
# kernel is back in its loop and idle (:meth:`Kernel.not_idle_because`): blocked in ``read``
# on its request fd (``/proc/PID/syscall``), alone (``Threads: 1``) and with every signal it
# catches blocked (``/proc/PID/status``: the loop blocks them all before it reads, so that no
# handler or timer can wake it). Such a process runs nothing until its next request. The
# runner looks at once after the answer, again and again for a fraction of a millisecond
# (the loop reads its next request within microseconds), then after short growing pauses
# (its select loop never waits longer). A kernel never proven idle gets no exit record: the
# daemon's deadline stops the call (``I``, then ``K``) and the kernel with it. One case is
# decided here: a kernel parked in its loop that still runs other threads after
# THREADS_SETTLE_S (the call's code left a thread running, which could write into a later
# call) is ended, and its record says why (``not_idle``). Numeric libraries start no thread
# pools of their own in a kernel: OPENBLAS/OMP/MKL_NUM_THREADS are 1 unless the request's
# environment sets them.
#
# Interrupt before kill: ``I`` (the call's deadline, a cancel, an interrupt request) makes the
# runner send SIGINT to the kernel, whose handler raises KeyboardInterrupt in the user's code
# while it runs (deferred while a display frame is being written, dropped once the code has
# ended: :func:`interrupt_user_code`). A kernel that answers and is proven idle within the
# request's ``interrupt_grace_s`` is kept (the record says ``kernel_interrupted``); else the
# runner kills it (``kernel_lost``, ``not_idle`` says why). A kernel that had answered already
# but was not proven idle gets no signal: the same grace, then it is killed.

KERNEL_REPLY = {b"v": (1, 1 + MAX_VALUE_JSON)}
_KCTL, _KREP, _KDISP = 3, 4, 5  # the kernel's request, reply and display fds
#: a kernel's numeric libraries run one thread each (a thread left running is not idle)
KERNEL_THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: ``read(2)``'s number (``/proc/PID/syscall`` shows numbers) on the machines sandboxd runs on
READ_SYSCALL = {"x86_64": 0, "aarch64": 63}.get(os.uname().machine, -1)
#: how long the runner looks again and again at a kernel that just answered (its loop reads
#: the next request within microseconds), then the pauses between looks, at first and at most
SPIN_S, FIRST_LOOK_S, LAST_LOOK_S = 0.0003, 0.0005, 0.02
#: how long a kernel parked in its loop may still run other threads before it is ended
THREADS_SETTLE_S = 1.0
MAX_INTERRUPT_GRACE_S = 60.0


def _signal_masks():
    """``(block, restore)`` for the kernel's loop: block every signal, then restore the mask
    that was there before. ``rt_sigprocmask`` itself (through ctypes): glibc's sigprocmask, and
    so Python's ``pthread_sigmask``, leaves out the two signals glibc keeps for itself (32 and
    33), and a process that ever started a thread (numpy's pools, matplotlib's font-cache
    timer) catches 33 for good - a kernel that cannot block it could never be proven idle.
    On another machine (syscall number unknown), glibc's call without them."""
    number = {"x86_64": 14, "aarch64": 135}.get(os.uname().machine)  # rt_sigprocmask
    if number is None:
        every_signal, before = frozenset(signal.valid_signals()), [set()]

        def block(sigmask=_signal.pthread_sigmask, every=every_signal, saved=before):
            saved[0] = sigmask(signal.SIG_BLOCK, every)

        def restore(sigmask=_signal.pthread_sigmask, saved=before):
            sigmask(signal.SIG_SETMASK, saved[0])

        return block, restore
    syscall = ctypes.CDLL(None, use_errno=True).syscall  # a function object of its own
    syscall.restype = ctypes.c_long
    syscall.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                        ctypes.c_size_t)
    masks = (ctypes.c_uint64(2 ** 64 - 1), ctypes.c_uint64(0))  # kept alive by the closures
    every_at, saved_at = ctypes.addressof(masks[0]), ctypes.addressof(masks[1])

    def block(syscall=syscall, number=number, every=every_at, saved=saved_at, keep=masks):
        syscall(number, 0, every, saved, 8)  # SIG_BLOCK (the kernel spares SIGKILL, SIGSTOP)

    def restore(syscall=syscall, number=number, saved=saved_at, keep=masks):
        syscall(number, 2, saved, None, 8)  # SIG_SETMASK

    return block, restore


KERNEL_MASKS = _signal_masks()


# The kernel's own machinery binds what it uses when this file is loaded (default arguments):
# user code that patches builtins or modules (``builtins.len = ...``, ``json.dumps = ...``)
# changes its own state, not how its kernel talks to the runner.


def _read_exact(fd, n, read=os.read, len=len, bytes=bytes, bytearray=bytearray):
    buf = bytearray()
    while len(buf) < n:
        chunk = read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _answer(status, value, message=None, pack=wire.HEADER.pack, len=len, bytes=bytes,
            value_json=value_json):
    """The ``v`` frame for the runner: the status byte and :func:`value_json` (the value's
    JSON, or a failed cell's exception line)."""
    payload = bytes([status]) + value_json(value if status == 0 else None, message)
    return pack(b"v", 0, len(payload)) + payload


def _send_answer(frame, write=os.write, memoryview=memoryview):
    view = memoryview(frame)
    while view:
        view = view[write(_KREP, view):]


def kernel_main(req, unpack=struct.unpack, loads=marshal.loads, isinstance=isinstance,
                str=str, masks=KERNEL_MASKS, execute=execute, answer=_answer,
                send=_send_answer, state=CELL):
    """The kernel's loop (in its process): read a request, execute it in the persistent
    namespace, answer; exit when the runner closes the request pipe. Every signal is blocked
    from its answer until it has read the next request (:func:`_signal_masks`): the runner
    proves from outside that it is parked there."""
    _user_streams()
    _user_environment(req)
    for name in KERNEL_THREAD_ENV:
        os.environ.setdefault(name, "1")
    user_builtins = _user_builtins(req)  # one copy for the kernel's life: state, like globals
    namespace = {"__name__": "__main__", "__builtins__": user_builtins}
    caps_of, display_tools = display_rules.DisplayCaps, _user_display
    block, restore = masks
    block()  # idle (from its answer to its next request): nothing but that request wakes it
    while True:
        head = _read_exact(_KCTL, 4)
        if head is None:
            os._exit(0)
        body = _read_exact(_KCTL, unpack(">I", head)[0])
        if body is None:
            os._exit(0)
        restore()
        cell = loads(body)
        # this call's display() (its own count) and import rule (the policy may have
        # changed since the last call)
        display = display_tools(_KDISP, caps_of(**cell.get("display")))
        user_builtins["__import__"] = _user_import(
            list(cell.get("imports_allow") or ()), list(cell.get("imports_deny") or ()),
            lambda display=display: _hook_pyplot(display))
        user_builtins["display"] = display
        namespace["__builtins__"] = user_builtins
        code = cell.get("code")
        try:
            status, value = execute(code if isinstance(code, str) else "", namespace, display)
        except KeyboardInterrupt:  # an interrupt that came just as the code ended
            status, value = 1, None
        state.running = False
        frame = answer(status, value, state.message)
        block()  # before it answers: then it only reads
        send(frame)


def kernel_child(req, ctl_r, rep_w, out_w, err_w, disp_w):
    """In the forked kernel: set up fds, session, signals, then serve calls forever."""
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        ctl = fcntl.fcntl(ctl_r, fcntl.F_DUPFD_CLOEXEC, 200)
        rep = fcntl.fcntl(rep_w, fcntl.F_DUPFD_CLOEXEC, 200)
        disp = fcntl.fcntl(disp_w, fcntl.F_DUPFD_CLOEXEC, 200)
        os.dup2(ctl, _KCTL, inheritable=False)
        os.dup2(rep, _KREP, inheritable=False)
        os.dup2(disp, _KDISP, inheritable=False)
        os.closerange(_KDISP + 1, 65536)
        set_dumpable(1)  # the channel's fd is closed: user code may see its own process
        try:
            with open("/proc/self/oom_score_adj", "w") as fh:
                fh.write("1000")
        except OSError:
            pass
        for sig in (signal.SIGPIPE, signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, interrupt_user_code)  # the runner's interrupt
        os.umask(0o022)
        os.chdir(req.get("cwd") or "/workspace")
        kernel_main(req)
    except BaseException as exc:
        try:
            os.write(2, f"sandboxd kernel: {exc!r}\n".encode())
        finally:
            os._exit(126)


def _proc_stat(pid):
    """(pgrp, state, cpu ticks) of a process from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[2]), fields[0], int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


_TICKS = os.sysconf("SC_CLK_TCK")


def _status_field(status, name):
    """The value of field ``name`` of a /proc/PID/status text, or None (the process name, the
    first line, has its newlines escaped: no line can pose as another field)."""
    start = status.find(b"\n" + name + b":")
    if start < 0:
        return None
    start += len(name) + 2
    end = status.find(b"\n", start)
    return status[start:end if end >= 0 else len(status)].strip()


def _read_proc(dfd, name, size):
    """A file of the /proc directory ``dfd`` (one read: these are generated whole)."""
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


class Kernel:
    """The container's session kernel, as the runner keeps it."""

    def __init__(self):
        self.pid = None
        self.calls = 0
        self.ctl_w = None
        self.rep_r = None
        self.streams = {}  # out/err pipe fd -> frame kind
        self.pipes = set()
        self.current = None  # the KernelCall running now
        self.decoder = None
        self.ended = (None, None, True)  # (wait status, rusage, group gone) of the last one
        self.threads = False  # the last look found it parked but with other threads
        self.proc_fd = None  # its /proc directory

    @property
    def alive(self):
        return self.pid is not None

    def start(self, req):
        """Fork a fresh kernel."""
        ctl_r, self.ctl_w = os.pipe()
        self.rep_r, rep_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        disp_r, disp_w = os.pipe()
        try:
            pid = os.fork()
            if pid == 0:
                kernel_child(req, ctl_r, rep_w, out_w, err_w, disp_w)  # never returns
        finally:
            for fd in (ctl_r, rep_w, out_w, err_w, disp_w):
                os.close(fd)
        self.pid, self.calls = pid, 0
        try:  # this very process's /proc directory (a reused pid is another directory)
            self.proc_fd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            self.proc_fd = None  # never proven idle: its calls end at their deadline
        self.streams = {out_r: b"o", err_r: b"e", disp_r: b"d"}
        self.pipes = {out_r, err_r, disp_r, self.rep_r}
        for fd in self.pipes:
            os.set_blocking(fd, False)

    def send(self, req):
        """Hand the kernel a call (it reads it at once: it is idle)."""
        # marshal (C code only, unlike json) keeps the kernel's loop independent of builtins
        caps = display_rules.DisplayCaps(**(req.get("display") or {}))
        body = marshal.dumps({"code": str(req.get("code") or ""),
                              "imports_allow": [str(n) for n in req.get("imports_allow") or ()],
                              "imports_deny": [str(n) for n in req.get("imports_deny") or ()],
                              "display": {"item_bytes": int(caps.item_bytes),
                                          "count": int(caps.count)}})
        data = struct.pack(">I", len(body)) + body
        self.decoder = wire.Decoder(KERNEL_REPLY, max_frames=1,
                                    max_bytes=wire.HEADER.size + 1 + MAX_VALUE_JSON)
        self.calls += 1
        _write_all(self.ctl_w, data)

    def on_pipe(self, fd):
        """Output or an answer of the kernel (a call's, or stray between calls)."""
        if fd not in self.pipes:
            return
        if self.streams.get(fd) == b"d":
            self.drain_text()  # what was printed before the item goes first (issue 29)
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        call = self.current
        if not data:
            self.pipes.discard(fd)
            os.close(fd)
            if fd == self.rep_r:
                self.rep_r = None
                self.stop()  # its answer pipe is gone: the kernel is dead or broken
            return
        if fd != self.rep_r:
            if call is not None:
                call.relay(self.streams[fd], data)
            return
        frames = None
        if call is not None and call.reply is None:
            try:
                frames = self.decoder.feed(data)
            except wire.ProtocolError:
                frames = None
            else:
                if not frames:
                    return  # a part of the answer
        if not frames:  # a malformed answer, or one nobody asked for: the kernel ends
            if call is not None:
                call.broken = "the kernel broke its answer protocol"
            self.stop()
            return
        call.reply = frames[0].payload

    def check(self):
        """Notice a kernel that died by itself (between calls, or with its pipes held open
        by a process it forked)."""
        if self.pid is None:
            return
        try:
            done, status, usage = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:
            done, status, usage = self.pid, None, None
        if done == self.pid:
            self.stop(status, usage)

    def drain_text(self):
        """Relay what the kernel's stdout and stderr pipes hold now (bounded; see
        :meth:`Call.drain_text`)."""
        for fd in [f for f, kind in self.streams.items() if kind != b"d"]:
            for _ in range(64):
                if fd not in self.pipes or self.current is None:
                    break
                try:
                    data = os.read(fd, CHUNK)
                except OSError:
                    break
                if not data:
                    break
                self.current.relay(self.streams[fd], data)

    def drain(self):
        """Relay what the kernel wrote before it answered (it is in the pipes already)."""
        for fd in list(self.streams):
            for _ in range(64):
                if fd not in self.pipes:
                    break
                try:
                    data = os.read(fd, CHUNK)
                except OSError:
                    break
                if not data:
                    break
                if self.current is not None:
                    self.current.relay(self.streams[fd], data)

    def stop(self, status=None, usage=None):
        """Kill the kernel and its process group (``status``: it was reaped already)."""
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        _killpg(pid)
        if status is None:
            try:
                _, status, usage = os.wait4(pid, 0)
            except ChildProcessError:
                status, usage = None, None
        _killpg(pid)
        self.ended = (status, usage, _group_gone(pid))
        self.drain()  # what it wrote before it died is the call's output
        for fd in [*self.pipes, self.ctl_w, self.proc_fd]:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.pipes, self.streams, self.ctl_w, self.rep_r = set(), {}, None, None
        self.proc_fd = None

    def sweep(self):
        """Kill what the last call left in the kernel's process group (not the kernel);
        True once nothing is left."""
        for _ in range(2):
            left = False
            for name in os.listdir("/proc"):
                if not name.isdigit() or int(name) == self.pid:
                    continue
                st = _proc_stat(name)
                if st and st[0] == self.pid and st[1] != "Z":
                    left = True
                    try:
                        os.kill(int(name), signal.SIGKILL)
                    except OSError:
                        pass
            if not left:
                return True
            time.sleep(0.01)
        return False

    def cpu_ticks(self):
        st = _proc_stat(self.pid) if self.pid else None
        return st[2] if st else 0

    def peak_memory(self):
        try:
            with open(f"/proc/{self.pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError, TypeError):
            pass
        return 0

    def not_idle_because(self):
        """None when the kernel is parked in its loop (see "the session kernel": blocked
        reading its request fd, alone, every signal it catches blocked), else what it does
        instead; ``threads`` is True when only its other threads keep it from being idle."""
        self.threads = False
        if self.proc_fd is None:
            return "its state could not be read"
        try:
            syscall = _read_proc(self.proc_fd, "syscall", 512).split()
        except OSError as exc:
            return f"its state could not be read ({type(exc).__name__})"
        if not syscall or syscall[0] == b"running":
            return "it is running"
        try:
            parked = int(syscall[0]) == READ_SYSCALL and int(syscall[1], 16) == _KCTL
        except (IndexError, ValueError):
            parked = False
        if not parked:
            return (f"it is in system call {syscall[0].decode(errors='replace')[:20]}, "
                    "not waiting for its next request")
        try:
            status = _read_proc(self.proc_fd, "status", 16384)
        except OSError as exc:
            return f"its state could not be read ({type(exc).__name__})"
        threads = _status_field(status, b"Threads")
        if threads != b"1":
            self.threads = True
            return ("the call's code left threads running "
                    f"({(threads or b'?').decode(errors='replace')[:20]} threads)")
        try:
            blocked = int(_status_field(status, b"SigBlk"), 16)
            caught = int(_status_field(status, b"SigCgt"), 16)
        except (TypeError, ValueError):
            return "its signal masks could not be read"
        if caught & ~blocked:
            return "a signal it catches could still wake it"
        return None


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _grace(req):
    """The request's ``interrupt_grace_s``, within bounds (0 when it has none)."""
    try:
        grace = float(req.get("interrupt_grace_s") or 0)
    except (TypeError, ValueError):
        return 0.0
    return min(max(grace, 0.0), MAX_INTERRUPT_GRACE_S) if grace == grace else 0.0


class KernelCall(Call):
    """One call in the kernel: its output is relayed by :class:`Kernel`, its end is the
    kernel's answer once the kernel is proven idle (or the kernel's death)."""

    def __init__(self, chan, cid, req, kernel):
        super().__init__(chan, cid, req)
        self.kernel = kernel
        self.reply = None
        self.broken = None
        self.fresh = False
        self.cpu0 = 0
        self.stopped = False  # a kernel_stop request ended it
        self.replied = None  # when its answer came (monotonic)
        self.next_look = 0.0  # when to look at the kernel again (after its answer)
        self.pause = FIRST_LOOK_S
        self.idle = False  # proven idle after its answer: the call is over
        self.not_idle = None  # what the kernel did instead, at the last look
        self.given_up = False  # it is ended for not being idle (threads, the grace is over)
        self.grace = _grace(req)
        self.interrupt_until = None  # ``I`` came: the kernel is killed unless idle by then
        self.interrupted = False  # SIGINT was sent while its code ran

    def start(self):
        kernel = self.kernel
        kernel.check()
        for _ in range(2):
            if not kernel.alive:
                kernel.start(self.req)
                self.fresh = True
            self.pid = kernel.pid
            self.cpu0 = kernel.cpu_ticks()
            kernel.current = self
            try:
                kernel.send(self.req)
                return
            except BrokenPipeError:  # it died since: a fresh one
                kernel.current = None
                kernel.stop()
        raise OSError(32, "the kernel died at once")

    def relay(self, kind, data):
        if kind == b"d":
            if not self.relay_display(data):
                self.broken = self.broken or self.display_error
            return
        if self.output_limit or self.hangup:
            return
        data = data[: self.budget.take(len(data))]
        self.output_limit = self.budget.exceeded
        if data:
            try:
                send_frame(self.chan, kind, data, self.cid)
            except OSError:
                self.hangup = True

    @property
    def wake(self):
        looks = [t for t in (self.next_look if self.reply is not None else None,
                             self.interrupt_until) if t is not None]
        return min(looks) if looks else None

    def interrupt(self, now):
        """``I``: SIGINT to the kernel while its code runs (its handler raises
        KeyboardInterrupt there); unless it answers and is proven idle within the grace, it
        is killed then."""
        kernel = self.kernel
        if self.interrupt_until is not None or not kernel.alive:
            return
        self.interrupt_until = now + self.grace
        if self.reply is None and kernel.rep_r is not None:
            kernel.on_pipe(kernel.rep_r)  # an answer already written is no reason to interrupt
        if self.reply is None and kernel.alive and not self.broken:
            try:
                os.kill(kernel.pid, signal.SIGINT)
                self.interrupted = True
            except OSError:
                pass

    def poll(self, now):
        """True when the call can be finished: the kernel answered and is proven idle, it
        died, the call hit a limit or was stopped, or it is given up (see the kernel's
        section)."""
        if self.stopping or self.broken:
            return True
        kernel = self.kernel
        kernel.check()
        if not kernel.alive:
            return True
        if self.reply is not None and now >= self.next_look:
            self.not_idle = kernel.not_idle_because()
            if self.replied is None:  # its loop reads its next request within microseconds
                self.replied = now
                spin_until = time.monotonic() + SPIN_S
                while self.not_idle is not None and time.monotonic() < spin_until:
                    os.sched_yield()
                    self.not_idle = kernel.not_idle_because()
            if self.not_idle is None:
                self.idle = True
                return True
            if kernel.threads and now - self.replied >= THREADS_SETTLE_S:
                self.given_up = True
                return True
            self.next_look = time.monotonic() + self.pause
            self.pause = min(self.pause * 2, LAST_LOOK_S)
        if self.interrupt_until is not None and now >= self.interrupt_until:
            self.given_up = True
            if self.reply is None:
                self.not_idle = (f"its code did not come back from the interrupt within "
                                 f"{self.grace:g} s")
            elif self.not_idle:
                self.not_idle = f"the kernel answered but never went idle ({self.not_idle})"
            return True
        return False

    def finish(self):
        kernel = self.kernel
        group_gone = True
        record = {}
        if (self.idle and self.reply is not None and not self.stopping and not self.broken
                and kernel.alive):
            kernel.drain()
            group_gone = kernel.sweep()
            record["exit_code"] = self.reply[0]
            if len(self.reply) > 1:
                self.value_buf = bytearray(self.reply[1:])
            cpu = kernel.cpu_ticks() - self.cpu0
        else:  # the kernel died, or the call hit a limit or was stopped: the kernel ends
            cpu = kernel.cpu_ticks() - self.cpu0 if kernel.alive else 0
            if kernel.alive:
                kernel.drain()
                kernel.stop()
            status, _, group_gone = kernel.ended
            record["exit_code"] = (os.waitstatus_to_exitcode(status)
                                   if status is not None and os.WIFEXITED(status) else None)
            record["signal"] = (os.WTERMSIG(status)
                                if status is not None and os.WIFSIGNALED(status) else None)
            record["kernel_lost"] = True
            if self.given_up and self.not_idle:
                record["not_idle"] = self.not_idle[:500]
        kernel.current = None
        oom1, pids1 = cgroup_counters()
        record.update({
            "cpu_ms": max(int(cpu * 1000 / _TICKS), 0),
            "peak_memory_bytes": kernel.peak_memory() if kernel.alive else 0,
            "wall_ms": int((time.monotonic() - self.started) * 1000),
            "oom": oom1 > self.oom0,
            "pids_limit": self.pids_limit or pids1 > self.pids0,
            "output_limit": self.output_limit,
            "group_gone": group_gone,
            "kernel_fresh": self.fresh,
            "kernel_calls": kernel.calls,
            "kernel_stopped": self.stopped,
        })
        record.setdefault("kernel_lost", False)
        if self.interrupted and not record["kernel_lost"]:
            record["kernel_interrupted"] = True
        if self.broken:
            record["error"] = self.broken
        if self.value_buf:
            answer_fields(record, self.value_buf)
        if not self.hangup:
            try:
                send_frame(self.chan, b"x", json.dumps(record).encode(), self.cid)
            except OSError:
                pass


def _start_kernel_call(chan, cid, req, kernel, calls, owners):
    if kernel.current is not None:
        _refuse(chan, cid, "the session's kernel is busy with another call")
        return
    call = KernelCall(chan, cid, req, kernel)
    try:
        call.start()
    except OSError as exc:
        kernel.current = None
        kernel.stop()
        _refuse(chan, cid, f"cannot start the kernel: {exc.strerror}",
                exc.errno == 11 or cgroup_counters()[1] > call.pids0)
        return
    calls[cid] = call
    for pfd in kernel.pipes:
        owners[pfd] = kernel


def _stop_kernel(chan, cid, kernel):
    """A ``kernel_stop`` request: end the kernel (a call in it ends as stopped)."""
    was = kernel.alive
    if kernel.current is not None:
        kernel.current.stopped = True
    kernel.stop()
    try:
        send_frame(chan, b"x", json.dumps({"kernel_lost": was}).encode(), cid)
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


def open_channel():
    """Read the key, connect once, say hello with it; then forget the key."""
    key = bytearray(KEY_BYTES)
    with open(KEY_PATH, "rb", buffering=0) as fh:
        if fh.readinto(key) != KEY_BYTES:
            sys.exit(3)
    chan = connect()
    try:
        chan.sendall(wire.HEADER.pack(b"h", 0, KEY_BYTES))
        chan.sendall(key)
    finally:
        key[:] = bytes(KEY_BYTES)
    return chan


def _refuse(chan, cid, message, pids_limit=False):
    record = {"error": message[:1000], "pids_limit": pids_limit}
    try:
        send_frame(chan, b"x", json.dumps(record).encode(), cid)
    except OSError:
        pass


KERNEL = Kernel()  # the container's session kernel (started by its first call)


def _start(chan, cid, body, calls, owners):
    """Start the call a request frame asks for (or answer why it cannot start)."""
    if cid in calls:
        return
    try:
        req = json.loads(body)
        if not isinstance(req, dict):
            raise ValueError
    except ValueError:
        _refuse(chan, cid, "malformed request")
        return
    if req.get("kind") == "kernel_stop":
        _stop_kernel(chan, cid, KERNEL)
        return
    if req.get("kind") == "python" and req.get("kernel"):
        _start_kernel_call(chan, cid, req, KERNEL, calls, owners)
        return
    call = Call(chan, cid, req)
    try:
        call.start()
    except OSError as exc:
        for pfd in call.pipes:
            os.close(pfd)
        _refuse(chan, cid, f"cannot start the process: {exc.strerror}",
                exc.errno == 11 or cgroup_counters()[1] > call.pids0)
        return
    calls[cid] = call
    for pfd in call.pipes:
        owners[pfd] = call


def main():
    """One process, one select loop: the channel, every call's pipes and worker."""
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.umask(0o022)
    if not set_dumpable(0):
        sys.exit(4)  # never serve calls with our memory and fds readable by user code
    # Everything imported so far is shared with every forked worker: keep the garbage
    # collector from touching (and so copying) those pages after each fork.
    gc.collect()
    gc.freeze()
    chan = open_channel()
    cfd = chan.fileno()
    decoder = wire.Decoder({b"R": (2, MAX_REQUEST), b"K": (0, 0), b"I": (0, 0)})
    calls = {}  # call id -> Call
    owners = {}  # pipe fd -> Call
    last_pids_check = 0.0
    while True:
        timeout = 0.05 if calls else None
        wakes = [call.wake for call in calls.values() if call.wake is not None]
        if wakes:  # a kernel that answered is looked at again soon (see the kernel's section)
            timeout = min(timeout, max(min(wakes) - time.monotonic(), 0.0))
        try:
            ready, _, _ = select.select([cfd, *owners], [], [], timeout)
        except InterruptedError:
            continue
        for fd in ready:
            if fd == cfd:
                try:
                    data = chan.recv(wire.READ_BYTES, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                try:
                    frames = decoder.feed(data) if data else None
                except wire.ProtocolError:
                    frames = None
                if frames is None:  # the daemon hung up (or broke the protocol): stop all
                    for call in calls.values():
                        _killpg(call.pid)
                    KERNEL.stop()
                    return 0
                for frame in frames:
                    if frame.kind == b"R":
                        _start(chan, frame.call, frame.payload, calls, owners)
                    elif frame.call not in calls:
                        continue
                    elif frame.kind == b"I":  # interrupt before kill (a kernel call)
                        calls[frame.call].interrupt(time.monotonic())
                    else:  # b"K": the daemon stopped waiting for it
                        calls[frame.call].hangup = True
            elif fd in owners and fd in owners[fd].pipes:
                owners[fd].on_pipe(fd)
        now = time.monotonic()
        if calls and now - last_pids_check >= 0.05:
            last_pids_check = now
            pids_now = cgroup_counters()[1]
            for call in calls.values():
                if pids_now > call.pids0:
                    call.pids_limit = True
        for cid, call in list(calls.items()):
            if call.poll(now):
                for pfd in call.pipes:
                    owners.pop(pfd, None)
                del calls[cid]
                call.finish()
        for fd in [f for f, owner in owners.items() if f not in owner.pipes]:
            del owners[fd]  # closed (a finished call's, a kernel's that ended)


if __name__ == "__main__":
    sys.exit(main())
