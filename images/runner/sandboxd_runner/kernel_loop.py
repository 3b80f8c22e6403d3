"""The session kernel's own process: forked from the runner, it serves one call after another
in one persistent namespace (see sandboxd_runner.kernel for the protocol and why the runner
can prove from outside that it is idle).

The kernel's own machinery binds what it uses when this module is loaded (default arguments):
user code that patches builtins or modules (``builtins.len = ...``, ``json.dumps = ...``)
changes its own state, not how its kernel talks to the runner.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # pthread_sigmask without signal's enum members (tens of microseconds a call)
import builtins
import ctypes
import fcntl
import marshal
import os
import signal
import struct
from collections.abc import Callable, Sized
from typing import Any, NoReturn

from sandboxd.protocol import display as display_rules
from sandboxd.protocol import wire
from sandboxd.protocol.call import WorkerRequest

from .base import set_dumpable
from .displays import hook_pyplot, user_display
from .execution import (
    execute,
    fresh_site,
    user_builtins,
    user_environment,
    user_import,
    user_streams,
    value_json,
)
from .interrupts import CELL, interrupt_user_code
from .rlimits import Rlimits, apply_rlimits

KCTL, KREP, KDISP = 3, 4, 5  # the kernel's request, reply and display fds
#: a kernel's numeric libraries run one thread each (a thread left running is not idle)
KERNEL_THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _glibc_masks() -> tuple[Callable[[], None], Callable[[], None]]:
    """``(block, restore)`` through glibc (signals 32 and 33 left out: see below)."""
    every_signal, before = frozenset(signal.valid_signals()), [set[int]()]

    def block(sigmask: Any = _signal.pthread_sigmask, every: Any = every_signal,
              saved: Any = before) -> None:
        saved[0] = sigmask(signal.SIG_BLOCK, every)

    def restore(sigmask: Any = _signal.pthread_sigmask, saved: Any = before) -> None:
        sigmask(signal.SIG_SETMASK, saved[0])

    return block, restore


def _signal_masks() -> tuple[Callable[[], None], Callable[[], None]]:
    """``(block, restore)`` for the kernel's loop: block every signal, then restore the mask
    that was there before. ``rt_sigprocmask`` itself (through ctypes): glibc's sigprocmask, and
    so Python's ``pthread_sigmask``, leaves out the two signals glibc keeps for itself (32 and
    33), and a process that ever started a thread (numpy's pools, matplotlib's font-cache
    timer) catches 33 for good - a kernel that cannot block it could never be proven idle.
    On another machine (syscall number unknown), glibc's call without them."""
    number = {"x86_64": 14, "aarch64": 135}.get(os.uname().machine)  # rt_sigprocmask
    if number is None:
        return _glibc_masks()
    syscall = ctypes.CDLL(None, use_errno=True).syscall  # a function object of its own
    syscall.restype = ctypes.c_long
    syscall.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                        ctypes.c_size_t)
    masks = (ctypes.c_uint64(2 ** 64 - 1), ctypes.c_uint64(0))  # kept alive by the closures
    every_at, saved_at = ctypes.addressof(masks[0]), ctypes.addressof(masks[1])

    def block(syscall: Any = syscall, number: int = number, every: int = every_at,
              saved: int = saved_at, keep: Any = masks) -> None:
        syscall(number, 0, every, saved, 8)  # SIG_BLOCK (the kernel spares SIGKILL, SIGSTOP)

    def restore(syscall: Any = syscall, number: int = number, saved: int = saved_at,
                keep: Any = masks) -> None:
        syscall(number, 2, saved, None, 8)  # SIG_SETMASK

    return block, restore


KERNEL_MASKS = _signal_masks()


# (the loop's names bound as defaults: local lookups, on the path of every kernel call)
def _read_exact(fd: int, n: int, read: Callable[[int, int], builtins.bytes] = os.read,
                len: Callable[[Sized], int] = len, bytes: type[builtins.bytes] = bytes,
                bytearray: type[builtins.bytearray] = bytearray) -> builtins.bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _answer(status: int, value: Any, message: str | None = None,
            pack: Callable[..., builtins.bytes] = wire.HEADER.pack,
            len: Callable[[Sized], int] = len, bytes: type[builtins.bytes] = bytes,
            value_json: Callable[..., builtins.bytes] = value_json) -> builtins.bytes:
    """The ``v`` frame for the runner: the status byte and :func:`value_json` (the value's
    JSON, or a failed cell's exception line)."""
    payload = bytes([status]) + value_json(value if status == 0 else None, message)
    return pack(b"v", 0, len(payload)) + payload


def _send_answer(frame: bytes, write: Any = os.write, memoryview: Any = memoryview) -> None:
    view = memoryview(frame)
    while view:
        view = view[write(KREP, view):]


def kernel_main(req: WorkerRequest, unpack: Any = struct.unpack, loads: Any = marshal.loads,
                isinstance: Any = isinstance, str: Any = str, masks: Any = KERNEL_MASKS,
                execute: Any = execute, answer: Any = _answer, send: Any = _send_answer,
                state: Any = CELL) -> NoReturn:
    """The kernel's loop (in its process): read a request, execute it in the persistent
    namespace, answer; exit when the runner closes the request pipe. Every signal is blocked
    from its answer until it has read the next request (:func:`_signal_masks`): the runner
    proves from outside that it is parked there."""
    user_streams()
    user_environment(req)
    for name in KERNEL_THREAD_ENV:
        os.environ.setdefault(name, "1")
    kernel_builtins = user_builtins(req)  # one copy for the kernel's life: state, like globals
    namespace = {"__name__": "__main__", "__builtins__": kernel_builtins}
    caps_of, display_tools = display_rules.DisplayCaps, user_display
    block, restore = masks
    block()  # idle (from its answer to its next request): nothing but that request wakes it
    while True:
        head = _read_exact(KCTL, 4)
        if head is None:
            os._exit(0)
        body = _read_exact(KCTL, unpack(">I", head)[0])
        if body is None:
            os._exit(0)
        restore()
        cell = loads(body)
        # this call's display() (its own count) and import rule (the policy may have
        # changed since the last call)
        display = display_tools(KDISP, caps_of(**cell.get("display")))
        kernel_builtins["__import__"] = user_import(
            list(cell.get("imports_allow") or ()), list(cell.get("imports_deny") or ()),
            lambda display=display: hook_pyplot(display))  # type: ignore[misc]
        kernel_builtins["display"] = display
        namespace["__builtins__"] = kernel_builtins
        fresh_site()  # packages install_packages added since the last call
        code = cell.get("code")
        try:
            status, value = execute(code if isinstance(code, str) else "", namespace, display)
        except KeyboardInterrupt:  # an interrupt that came just as the code ended
            status, value = 1, None
        state.running = False
        frame = answer(status, value, state.message)
        block()  # before it answers: then it only reads
        send(frame)


def kernel_child(req: WorkerRequest, ctl_r: int, rep_w: int, out_w: int, err_w: int,
                 disp_w: int, rlimits: Rlimits = ()) -> None:
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
        os.dup2(ctl, KCTL, inheritable=False)
        os.dup2(rep, KREP, inheritable=False)
        os.dup2(disp, KDISP, inheritable=False)
        os.closerange(KDISP + 1, 65536)
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
        os.chdir(req.runner.cwd)
        apply_rlimits(rlimits)  # before user code: the kernel keeps them for its life
        kernel_main(req)
    except BaseException as exc:
        try:
            os.write(2, f"sandboxd kernel: {exc!r}\n".encode())
        finally:
            os._exit(126)
