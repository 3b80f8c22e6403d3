"""A sandbox worker, the zygote's child: it prepares itself before its call (cgroup, limits
preset), waits for its one request, confines itself (:func:`confine.enter_sandbox`), runs the
code restricted (:mod:`.lang`) or the readiness self-test (:mod:`.self_test`), and reports in
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
import json
import resource
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sandboxd.backends.restricted.lang.state import STATE, after_emit, interrupt_user_code
from sandboxd.backends.restricted.self_test import self_test
from sandboxd.backends.restricted.zygote_protocol import recv_buffer, recv_msg, write_all
from sandboxd.protocol import wire
from sandboxd.protocol.call import KERNEL_SURVIVES, RestrictedPart, WorkerReport, WorkerRequest

if TYPE_CHECKING:
    from sandboxd.backends.restricted.confine import ChildSpec

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

    # the call's own request and report too: every worker decodes one and encodes the
    # other, and their code (the records' codecs, JSON) would otherwise be quickened in
    # each worker's copy of its pages (measured: ~0.2 MiB of an idle kernel's private memory)
    request = json.loads(json.dumps(WorkerRequest(
        kind="python", id="c0", code="1", imports_allow=("math",), kernel=True,
        restricted=RestrictedPart(workspace="/", uid=1, cpu_seconds=2, max_file_bytes=1),
    ).to_wire()))
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
        WorkerRequest.from_wire(request)
        _report(WorkerReport(outcome="ok", value=1, has_value=True, value_repr="1",
                             cpu_ms=1, wall_ms=1, worker_us=1, peak_memory_bytes=1))
    lang.reset_run_state()


class _Quit(Exception):
    """The daemon hung up before the call could start: the worker exits quietly."""


@dataclass(frozen=True)
class _Standby:
    """What a standby worker was given by the zygote to prepare and confine itself with."""

    cgroup: str
    cfg: dict[str, Any]
    layout: Any
    program: Any
    preset: tuple[int, float, int]
    lifeline: int


@dataclass(frozen=True)
class _Confined:
    """A worker confined for its call: where its code runs and how it writes frames. A
    session kernel keeps ``namespace`` between calls (None: a one-shot worker)."""

    spec: ChildSpec
    workspace: str
    wfd: int
    emit: Callable[[bytes, bytes], None]
    namespace: dict[str, Any] | None


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
    Returns the exit status for ``os._exit``. Every report frame is written here."""
    from sandboxd.backends.restricted import contain

    standby = _Standby(cgroup, cfg, layout, program, preset, lifeline)
    try:
        setup_error = _prepare(sock, standby)
        baseline = contain.vm_size()
        raw = _receive(sock, recv_msg)
        t_recv = time.perf_counter()
        emit = _emitter(sock.fileno())
        entered = _enter(sock, raw, setup_error, standby, baseline)
    except _Quit:
        return 0
    if isinstance(entered, WorkerReport):  # the call cannot run
        emit(b"r", _report(entered))
        return 70
    msg, spec, state = entered
    import warnings

    warnings.simplefilter("ignore")
    worker = _Confined(spec, "/" if spec.chroot else spec.workspace, sock.fileno(), emit,
                       _kernel_namespace(msg))
    while True:
        report = replace(_answer(worker, msg, state),
                         worker_us=int((time.perf_counter() - t_recv) * 1e6))
        state = b""
        parks = worker.namespace is not None and report.outcome in KERNEL_SURVIVES
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
        try:
            msg, t_recv = _next_call(sock, mask)
        except _Quit:
            return 0


def _prepare(sock: _socket.socket, standby: _Standby) -> str | None:
    """The standby part, before the call is known: default signal handlers, then
    :func:`confine.prepare_worker`, the IPC namespace and the parent-death signal. Returns why
    it failed (told in the call's report), None when it did not; raises :class:`_Quit` when
    the zygote is already gone."""
    from sandboxd.backends.restricted import confine, contain, namespaces

    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    try:
        confine.prepare_worker([sock.fileno(), standby.lifeline], standby.layout,
                               standby.cgroup, standby.preset)
        if standby.cfg.get("namespaces"):
            namespaces.enter_ipc_namespace()
        contain.prctl(contain.PR_SET_PDEATHSIG, signal.SIGKILL)
        gone = namespaces.parent_gone(standby.lifeline)
    except BaseException as exc:
        return f"{type(exc).__name__}: {exc}"
    if gone:
        raise _Quit
    return None


def _receive(sock: _socket.socket, recv: Callable[[_socket.socket], Any]) -> Any:
    """``recv(sock)``; the daemon hanging up (or a broken message) raises :class:`_Quit`."""
    try:
        return recv(sock)
    except (EOFError, OSError, ValueError):
        raise _Quit from None


def _emitter(wfd: int) -> Callable[[bytes, bytes], None]:
    """How the worker writes a frame to the daemon (user code is told it is emitting, and
    checked for its limits after)."""

    def emit(kind: bytes, data: bytes) -> None:
        STATE.emitting = True
        try:
            write_all(wfd, wire.encode(kind, data))
        finally:
            STATE.emitting = False
        after_emit()

    return emit


def _setup_failed(why: str) -> WorkerReport:
    """The report of a call whose set-up failed (its code never ran)."""
    return WorkerReport(outcome="setup_error", message=why[:4096])


def _enter(sock: _socket.socket, raw: Any, setup_error: str | None, standby: _Standby,
           baseline: int) -> tuple[WorkerRequest, ChildSpec, bytes] | WorkerReport:
    """Decode the call's request (and a fork's state after it), check its uid, and confine
    this process for it (:func:`confine.enter_sandbox`). Returns the call, its spec and state,
    or the report of a call that cannot run; raises :class:`_Quit` when the daemon hangs up."""
    from sandboxd.backends.restricted import confine

    if setup_error is not None:
        return _setup_failed(setup_error)
    try:  # decoded once: its limits are the confinement's and the call's
        msg = WorkerRequest.from_wire(raw)
    except ValueError as exc:
        return _setup_failed(f"the call's request: {exc}")
    # a fork's first call: its parent's pickled state follows the request
    state = _receive(sock, lambda s: recv_buffer(s, msg.state_bytes)) if msg.state_bytes else b""
    uid_range, uid = standby.cfg.get("uid_range"), msg.restricted.uid
    if uid_range is not None and (uid is None or not 0 <= uid - uid_range[0] < uid_range[1]):
        return _setup_failed(f"the call's uid {uid!r} is not a sandbox uid")
    spec = _child_spec(msg, standby, baseline)
    try:
        confine.enter_sandbox(spec, standby.layout, standby.program)
    except MemoryError as exc:  # the call's memory limit is below the worker's needs
        return WorkerReport(outcome="memory_limit", message=str(exc)[:4096])
    except BaseException as exc:
        return _setup_failed(f"{type(exc).__name__}: {exc}")
    return msg, spec, state


def _child_spec(msg: WorkerRequest, standby: _Standby, baseline: int) -> ChildSpec:
    """How this worker confines itself for the call ``msg``: as the call's uid (= gid) when
    the zygote hands out sandbox uids."""
    from sandboxd.backends.restricted import confine

    cfg = standby.cfg
    uid = msg.restricted.uid if cfg.get("uid_range") is not None else None
    return confine.ChildSpec(
        cgroup=standby.cgroup,
        workspace=msg.restricted.workspace,
        limits=msg.limits,
        cpu_seconds=msg.restricted.cpu_seconds,
        max_file_bytes=msg.restricted.max_file_bytes,
        uid=uid,
        gid=uid,
        zygote_pid=cfg["zygote_pid"],
        chroot=bool(cfg.get("chroot")),
        baseline_vm=baseline,
        applied=standby.preset,
        landlock_abi=int(cfg.get("landlock_abi", 0)),
        lifeline_fd=standby.lifeline,
        # a kernel moves its soft CPU limit for every call (see move_cpu_limit)
        cpu_hard=resource.RLIM_INFINITY if msg.kernel else None,
    )


def _kernel_namespace(msg: WorkerRequest) -> dict[str, Any] | None:
    """A session kernel's namespace, kept between its calls, with its signal handlers set;
    None for a one-shot worker (or a probe)."""
    if not msg.kernel or msg.restricted.probe is not None:
        return None
    signal.signal(signal.SIGXCPU, cpu_exceeded)
    # the daemon interrupts a kernel's call before it kills it (the session keeps its state
    # if the code comes back); a handler, so that the signal reaches a kernel that is PID 1
    # of its namespace
    signal.signal(signal.SIGINT, interrupt_user_code)
    return {}


def _answer(worker: _Confined, msg: WorkerRequest, state: bytes) -> WorkerReport:
    """The report of one call: the self-test, a kernel's snapshot, a fork's state that could
    not be restored, or the call's code run restricted."""
    from sandboxd.backends.restricted import lang

    namespace = worker.namespace
    if msg.restricted.probe is not None:
        return self_test(msg)
    if msg.snapshot and namespace is not None:
        return snapshot_state(namespace, msg, worker.wfd)
    if state and namespace is not None and (
            failed := restore_state(namespace, state, msg, worker.workspace, worker.spec,
                                    worker.emit)):
        return WorkerReport(outcome="error", exit_code=1, message=failed, restore_failed=True)
    return WorkerReport(**lang.run_user_code(
        msg.code,
        imports_allow=list(msg.imports_allow),
        imports_deny=list(msg.imports_deny),
        workspace=worker.workspace,
        output_bytes=msg.limits.output_bytes,
        max_file_bytes=worker.spec.max_file_bytes,
        emit=worker.emit,
        namespace=namespace,
        display=msg.display.to_wire(),
    ))


def _next_call(sock: _socket.socket, mask: Any) -> tuple[WorkerRequest, float]:
    """A parked kernel's next request and when it came, its signal mask restored and its CPU
    limit moved for the call; the daemon closing the socket (EOF), or a request a kernel does
    not run, raises :class:`_Quit`. ``read``, not ``recv``: the seccomp filter denies the
    latter."""
    msg: WorkerRequest = _receive(
        sock, lambda s: WorkerRequest.from_wire(recv_msg(s, use_read=True)))
    _signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    t_recv = time.perf_counter()
    if msg.kind != "python" or msg.restricted.probe is not None:
        raise _Quit
    move_cpu_limit(1 if msg.restricted.cpu_call is None else msg.restricted.cpu_call)
    return msg, t_recv


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
    """A fork's or a woken kernel's fresh process: the carried state (its parent's, or its
    own from before it was hibernated) put into ``namespace`` before its first call
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
        carry.restore(namespace, state, hook, woken=msg.woken)
    except BaseException as exc:
        return (f"the session's state carried to this kernel could not be restored "
                f"({type(exc).__name__}: {str(exc)[:300]}); this kernel starts empty and the "
                "call's code did not run")[:4096]
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
