"""A sandbox worker, the zygote's child: it prepares itself before its call (cgroup, limits
preset), waits for its one request, confines itself (:func:`confine.enter_sandbox`), runs the
code restricted (:mod:`.lang`) or the readiness self-test (:func:`self_test`), and reports in
:mod:`sandboxd.protocol.wire` frames.
A request with ``"kernel": true`` makes it a session kernel: after
the report it stays, confined as it is, and runs the session's next requests in the same
persistent namespace until EOF or a call that does not end ``ok``/``error`` (see
:mod:`.kernel`). :func:`preimport` and :func:`prime` run in the zygote before it
forks, so that workers import nothing and start warm.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]
import _socket
import errno
import json
import os
import resource
import signal
import socket
import time
from dataclasses import replace
from typing import Any

from sandboxd.backends.restricted.lang.state import STATE, after_emit, interrupt_user_code
from sandboxd.backends.restricted.zygote_protocol import recv_exact, recv_msg, write_all
from sandboxd.protocol import wire
from sandboxd.protocol.call import KERNEL_SURVIVES, WorkerReport, WorkerRequest

#: what a kernel blocks while it waits for its next call (see .idle); blocked with the C
#: module's ``pthread_sigmask`` (2 us a call: ``signal``'s wraps every number in an enum)
ALL_SIGNALS = signal.valid_signals()


def preimport() -> None:
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

    import sandboxd.backends.restricted.confine
    import sandboxd.backends.restricted.lang
    import sandboxd.backends.restricted.lang.carry  # noqa: F401 - a kernel's fork state


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


def prime(rounds: int = 12) -> None:
    """Run a fixed, trusted sample call (compile + run) in the zygote itself, before it forks.

    CPython 3.11 specialises ("quickens") a function's bytecode in place after a few calls
    and fills lazy caches on first use; done here once, every worker inherits the result
    instead of redoing it - and copying the pages it writes to - per call. No user input is
    involved: the source is the constant above, and the per-run state it leaves is reset.
    """
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
    lang.reset_run_state()


def run_worker(
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
    from sandboxd.backends.restricted import confine, contain, lang, namespaces

    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    setup_error: str | None = None
    try:
        confine.prepare_worker([sock.fileno(), lifeline], layout, cgroup, preset)
        if cfg.get("namespaces"):
            namespaces.enter_ipc_namespace()
        contain.prctl(contain.PR_SET_PDEATHSIG, signal.SIGKILL)
        if namespaces.parent_gone(lifeline):
            return 0
    except BaseException as exc:
        setup_error = f"{type(exc).__name__}: {exc}"
    baseline = contain.vm_size()
    try:
        raw = recv_msg(sock)
    except (EOFError, OSError, ValueError):
        return 0
    t_recv = time.perf_counter()
    wfd = sock.fileno()

    def emit(kind: bytes, data: bytes) -> None:
        STATE.emitting = True
        try:
            write_all(wfd, wire.encode(kind, data))
        finally:
            STATE.emitting = False
        after_emit()

    msg: WorkerRequest | None = None
    if setup_error is None:
        try:  # decoded once: its limits are the confinement's and the call's
            msg = WorkerRequest.from_wire(raw)
        except ValueError as exc:
            setup_error = f"the call's request: {exc}"
    state = b""  # a fork's first call: its parent's pickled state follows the request
    if msg is not None and msg.state_bytes and setup_error is None:
        try:
            state = recv_exact(sock, msg.state_bytes)
        except (EOFError, OSError):
            return 0
    uid = msg.uid if msg is not None else None
    uid_range = cfg.get("uid_range")
    if setup_error is None and uid_range is not None and (
        uid is None or not uid_range[0] <= uid < uid_range[0] + uid_range[1]
    ):
        setup_error = f"the call's uid {uid!r} is not a sandbox uid"
    if setup_error is None and msg is not None:
        spec = confine.ChildSpec(
            cgroup=cgroup,
            workspace=msg.workspace,
            limits=msg.limits,
            cpu_seconds=msg.cpu_seconds,
            max_file_bytes=msg.max_file_bytes,
            uid=uid if uid_range is not None else None,
            gid=uid if uid_range is not None else None,
            zygote_pid=cfg["zygote_pid"],
            chroot=bool(cfg.get("chroot")),
            baseline_vm=baseline,
            applied=preset,
            landlock_abi=int(cfg.get("landlock_abi", 0)),
            lifeline_fd=lifeline,
            # a kernel moves its soft CPU limit for every call (see move_cpu_limit)
            cpu_hard=resource.RLIM_INFINITY if msg.kernel else None,
        )
        try:
            confine.enter_sandbox(spec, layout, program)
        except MemoryError as exc:  # the call's memory limit is below the worker's needs
            emit(b"r", _report(WorkerReport(outcome="memory_limit", message=str(exc)[:4096])))
            return 70
        except BaseException as exc:
            setup_error = f"{type(exc).__name__}: {exc}"
    if setup_error is not None or msg is None:
        emit(b"r", _report(WorkerReport(outcome="setup_error",
                                        message=str(setup_error)[:4096])))
        return 70
    import warnings

    warnings.simplefilter("ignore")
    workspace = "/" if spec.chroot else spec.workspace
    # a session kernel keeps its namespace between calls
    namespace: dict[str, Any] | None = {} if msg.kernel and msg.probe is None else None
    if namespace is not None:
        signal.signal(signal.SIGXCPU, cpu_exceeded)
        # the daemon interrupts a kernel's call before it kills it (the
        # session keeps its state if the code comes back); a handler, so
        # that the signal reaches a kernel that is PID 1 of its namespace
        signal.signal(signal.SIGINT, interrupt_user_code)
    while True:
        if msg.probe is not None:
            report = self_test(msg)
        elif msg.snapshot and namespace is not None:
            report = snapshot_state(namespace, msg, wfd)
        elif state and namespace is not None and (
                failed := restore_state(namespace, state, msg, workspace, spec, emit)):
            report = WorkerReport(outcome="error", exit_code=1, message=failed)
        else:
            report = WorkerReport(**lang.run_user_code(
                msg.code,
                imports_allow=list(msg.imports_allow),
                imports_deny=list(msg.imports_deny),
                workspace=workspace,
                output_bytes=msg.limits.output_bytes,
                max_file_bytes=spec.max_file_bytes,
                emit=emit,
                namespace=namespace,
                display=msg.display.to_wire(),
            ))
        state = b""
        report = replace(report, worker_us=int((time.perf_counter() - t_recv) * 1e6))
        parks = namespace is not None and report.outcome in KERNEL_SURVIVES
        # a kernel that goes on waits for the session's next call, already confined (same
        # chroot, uid, seccomp filter, Landlock domain, rlimits and cgroup), with every signal
        # blocked from before its report: the daemon proves from outside that it is parked in
        # the read below, unwakeable but by its next request (see .idle), and the sooner it
        # gets there after the report, the sooner the call ends
        if parks:
            trim_heap()  # an idle kernel keeps only what its state needs
        mask = _signal.pthread_sigmask(signal.SIG_BLOCK, ALL_SIGNALS) if parks else None
        emit(b"r", _report(report))
        if mask is None:
            return 0
        # the daemon closing the socket (EOF) ends it. ``read``, not ``recv``: the seccomp
        # filter denies the latter
        try:
            msg = WorkerRequest.from_wire(recv_msg(sock, use_read=True))
        except (EOFError, OSError, ValueError):
            return 0
        _signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        t_recv = time.perf_counter()
        if msg.kind != "python" or msg.probe is not None:
            return 0
        move_cpu_limit(1 if msg.cpu_call is None else msg.cpu_call)


def snapshot_state(namespace: dict[str, Any], msg: WorkerRequest, wfd: int) -> WorkerReport:
    """A kernel's namespace pickled (:func:`.lang.carry.snapshot`) and written as one ``s``
    frame; the report names what was left out, or says why nothing is carried."""
    from sandboxd.backends.restricted.lang import carry
    from sandboxd.backends.restricted.lang.modules import ImportHook

    hook = ImportHook(list(msg.imports_allow), list(msg.imports_deny))
    blob, not_carried, error = carry.snapshot(namespace, hook, msg.state_bytes)
    if blob is not None:
        STATE.emitting = True
        try:  # header, then the bytes as they are: no second copy of a large state
            write_all(wfd, wire.HEADER.pack(b"s", 0, blob.size))
            for part in blob.parts:
                write_all(wfd, part)
            del blob
        finally:
            STATE.emitting = False
    return WorkerReport(outcome="ok", not_carried=carry.reported(not_carried) or None,
                        error=error)


def restore_state(namespace: dict[str, Any], state: bytes, msg: WorkerRequest,
                  workspace: str, spec: Any, emit: Any) -> str | None:
    """A fork's fresh kernel: its parent's state put into ``namespace`` before its first call
    (:func:`.lang.carry.restore`, with this call's trusted globals already set: restoring may
    run user code). Returns why it failed (the namespace stays empty), else None."""
    from sandboxd.backends.restricted import lang
    from sandboxd.backends.restricted.lang import carry
    from sandboxd.backends.restricted.lang.files import WorkspaceOpener
    from sandboxd.backends.restricted.lang.modules import ImportHook
    from sandboxd.backends.restricted.lang.output import OutputStream
    from sandboxd.protocol.rules import OutputBudget

    hook = ImportHook(list(msg.imports_allow), list(msg.imports_deny))
    stdout = OutputStream(b"o", emit, OutputBudget(msg.limits.output_bytes))
    lang.refresh_namespace(namespace, lang.make_globals(
        hook, WorkspaceOpener(workspace, spec.max_file_bytes), stdout))
    try:
        carry.restore(namespace, state, hook)
    except BaseException as exc:
        return (f"the session state forked from its parent could not be restored "
                f"({type(exc).__name__}: {str(exc)[:300]}); this kernel starts empty")[:4096]
    finally:
        stdout.flush()
    return None


def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, resolved in the zygote (a worker in its chroot could not load
    libc), or None where there is none."""
    try:
        import ctypes

        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()


def trim_heap() -> None:
    """At the end of a kernel's call: give the C heap's free pages back to the system
    (``malloc_trim``), so that an idle kernel's private memory is its state, not the peak of
    its last call. Before the report, not after it: the daemon ends the call once it sees the
    kernel parked in its read (see .idle), and that wait should not grow."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def cpu_exceeded(*_: Any) -> None:
    """SIGXCPU in a kernel (its soft RLIMIT_CPU, moved per call): end the call with
    ``cpu_limit``, uncatchable by user code. A kernel without the daemon's outside hard limit
    needs this handler: as PID 1 of its namespace it ignores a SIGXCPU left at its default."""
    from sandboxd.backends.restricted.lang.state import STATE, LimitExceeded

    STATE.limit_hit = LimitExceeded("cpu_limit", "the call used up its CPU time")
    raise STATE.limit_hit


def move_cpu_limit(allowance: int) -> None:
    """A kernel's next call may use ``allowance`` more CPU seconds: the soft RLIMIT_CPU moves
    to what this process used so far plus that (within the hard limit, which the daemon may
    have set: see :mod:`.kernel`)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(ru.ru_utime + ru.ru_stime) + 1 + max(1, allowance)
    _old, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _report(report: WorkerReport) -> bytes:
    """The payload of an ``r`` frame."""
    return json.dumps(report.to_wire()).encode()


def self_test(msg: WorkerRequest) -> WorkerReport:
    """Trusted self-test code run inside a fully confined worker (readiness probe)."""
    from sandboxd.backends.restricted import contain, landlock

    checks: dict[str, tuple[bool, str]] = {}
    if msg.probe == "memory":
        limit = msg.limits.memory_bytes
        blocks: list[bytes] = []
        try:
            while len(blocks) * (4 << 20) < 3 * limit:
                blocks.append(b"x" * (4 << 20))
        except MemoryError:
            return WorkerReport(outcome="memory_limit", probe={
                "memory_limit": (True, f"MemoryError after {len(blocks) * 4} MiB")})
        return WorkerReport(outcome="ok", probe={
            "memory_limit": (False, f"allocated {len(blocks) * 4} MiB without hitting the "
                                    "limit")})
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.close()
        checks["socket_blocked"] = (False, "socket() succeeded")
    except OSError as exc:
        checks["socket_blocked"] = (exc.errno == errno.EPERM, f"socket(): {exc}")
    target = msg.outside_path
    try:
        with open(target, "w") as f:
            f.write("escaped")
        checks["write_outside_blocked"] = (False, f"wrote {target}")
    except OSError as exc:
        checks["write_outside_blocked"] = (True, f"open(outside, 'w'): {type(exc).__name__}")
    uid = os.getuid()
    abi = landlock.landlock_abi()
    checks["landlock"] = (
        abi == 0 or landlock.LANDLOCK_STATUS.startswith("enforced"),
        landlock.LANDLOCK_STATUS,
    )
    checks["unprivileged"] = (uid != 0 or not msg.expect_unprivileged, f"uid {uid}")
    pid = os.getpid()
    checks["pid_namespace"] = (
        pid == 1 or not msg.expect_namespaces,
        f"pid {pid} in its own PID namespace" if pid == 1 else
        f"pid {pid}: no PID namespace" + (f" ({msg.no_namespaces_reason}; sandboxes are "
                                          "separated by uid and seccomp)"
                                          if msg.no_namespaces_reason else ""),
    )
    try:
        mode = contain.prctl(contain.PR_GET_SECCOMP)
    except OSError:
        mode = -1
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        forked = True
    except OSError:
        forked = False
    checks["seccomp"] = (
        mode == 2 and not forked,
        f"seccomp mode {mode}, fork {'allowed' if forked else 'denied'}",
    )
    return WorkerReport(outcome="ok", probe=checks)
