"""Process layer of the restricted backend: cgroups, privilege drop, rlimits and seccomp.

The worker child calls :func:`enter_sandbox` right after the zygote forks it, before any user
code is compiled. The order matters:

1. new session / process group (``setsid``), stdin/stdout/stderr to ``/dev/null``, every other
   inherited descriptor closed except the result pipe;
2. a per-call cgroup (memory = memory+swap, CPU quota, pids) is created and joined while still
   root;
3. ``chroot`` into the workspace when root (the filesystem the worker can name is then only
   the workspace: no ``/proc``, no ``/tmp``, no docker socket), else ``chdir`` into it;
4. ``PR_SET_NO_NEW_PRIVS``; Landlock (when the kernel has it) confines the filesystem to the
   workspace - the only filesystem boundary when the daemon is not root - denies TCP
   bind/connect and scopes signals; as root: ``setgroups([])``, ``setresgid``, ``setresuid`` to the
   sandbox identity; then ``PR_SET_PDEATHSIG`` (cleared by the uid change, so set after it);
5. rlimits: address space, CPU seconds, open files, processes, file size, core 0;
6. the environment is emptied and the seccomp filter is loaded (last, so that the set-up above
   may use what the filter forbids).

Threads: the filter denies ``clone``/``clone3``/``fork``/``vfork`` outright, so user code can
neither start processes nor threads (a thread could otherwise outlive its call's output
accounting); the worker is single-threaded by construction.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import resource
import signal
from dataclasses import dataclass
from typing import Any

from sandboxd.backends.restricted.cgroups import (  # noqa: F401 - re-exported
    CgroupLayout,
    below_usage,
    cgroup_pids,
    read_small,
    remove_cgroup_dir,
)

PR_SET_PDEATHSIG = 1
PR_GET_SECCOMP = 21
PR_SET_NO_NEW_PRIVS = 38

#: syscalls the worker never needs; denied with EPERM (unknown names on an arch are skipped)
DENIED_SYSCALLS = [
    "socket",
    "socketpair",
    "connect",
    "bind",
    "listen",
    "accept",
    "accept4",
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "sendmmsg",
    "recvmmsg",
    "getsockopt",
    "setsockopt",
    "shutdown",
    "getpeername",
    "getsockname",
    "execve",
    "execveat",
    "fork",
    "vfork",
    "clone",
    "clone3",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kill",
    "tkill",
    "tgkill",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    "pidfd_open",
    "pidfd_getfd",
    "pidfd_send_signal",
    "kcmp",
    "process_madvise",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "setns",
    "unshare",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "open_by_handle_at",
    "name_to_handle_at",
    "quotactl",
    "fanotify_init",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "init_module",
    "finit_module",
    "delete_module",
    "swapon",
    "swapoff",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "syslog",
    "uselib",
    "vhangup",
    "lookup_dcookie",
    "sysfs",
    "personality",
    "ioperm",
    "iopl",
    "modify_ldt",
    "memfd_secret",
    "seccomp",
    "setuid",
    "setgid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setgroups",
    "setfsuid",
    "setfsgid",
    "capset",
    "migrate_pages",
    "move_pages",
    "mbind",
    "set_mempolicy",
]


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


_LIBC: Any = None


def prctl(option: int, arg2: int = 0) -> int:
    """``prctl(2)`` through libc."""
    global _LIBC
    if _LIBC is None:
        _LIBC = _libc()
    res = _LIBC.prctl(
        ctypes.c_int(option),
        ctypes.c_ulong(arg2),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
        ctypes.c_ulong(0),
    )
    if res < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(res)


PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class SeccompProgram:
    """A compiled BPF program (exported once by libseccomp in the zygote), loaded in a worker
    with a single ``prctl(PR_SET_SECCOMP)`` instead of recompiling the filter per call."""

    def __init__(self, bpf: bytes) -> None:
        if not bpf or len(bpf) % 8:
            raise ValueError("bad BPF program")
        self._buf = ctypes.create_string_buffer(bpf, len(bpf))
        self._prog = _SockFprog(len(bpf) // 8, ctypes.cast(self._buf, ctypes.c_void_p))

    @classmethod
    def build(cls, own_pid: int = 0) -> SeccompProgram:
        import tempfile

        filt = build_seccomp_filter(own_pid)
        with tempfile.TemporaryFile() as f:
            filt.export_bpf(f)
            f.seek(0)
            return cls(f.read())

    def load(self) -> None:
        """Install the filter in this process (needs no_new_privs or CAP_SYS_ADMIN)."""
        global _LIBC
        if _LIBC is None:
            _LIBC = _libc()
        res = _LIBC.prctl(
            ctypes.c_int(PR_SET_SECCOMP),
            ctypes.c_ulong(SECCOMP_MODE_FILTER),
            ctypes.c_void_p(ctypes.addressof(self._prog)),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        )
        if res != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"seccomp: {os.strerror(err)}")


# ----------------------------------------------------------------- landlock

_SYS_LANDLOCK_CREATE_RULESET = 444  # same number on every architecture (new syscalls)
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_RULE_PATH_BENEATH = 1
_FS_EXECUTE = 1 << 0
_FS_MAKE_CHAR = 1 << 6
_FS_MAKE_SOCK = 1 << 9
_FS_MAKE_FIFO = 1 << 10
_FS_MAKE_BLOCK = 1 << 11
_FS_MAKE_SYM = 1 << 12
#: what ``landlock_status`` says in this process once :func:`apply_landlock` ran
LANDLOCK_STATUS = "not applied"


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is unavailable."""
    global _LIBC
    if _LIBC is None:
        _LIBC = _libc()
    res = _LIBC.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(0, int(res))


def apply_landlock(workspace: str, abi: int) -> str:
    """Restrict the filesystem to ``workspace`` (read, write, create, delete; no exec, no
    device/socket/fifo/symlink creation), deny TCP bind/connect, and scope signals and abstract
    unix sockets to the worker (as far as the ABI allows). Needs no_new_privs. Returns a status
    line; raises OSError when Landlock is available but could not be applied."""
    global LANDLOCK_STATUS
    if abi <= 0:
        LANDLOCK_STATUS = "unavailable (kernel without Landlock)"
        return LANDLOCK_STATUS
    handled = (1 << 13) - 1
    if abi >= 2:
        handled |= 1 << 13  # REFER
    if abi >= 3:
        handled |= 1 << 14  # TRUNCATE
    if abi >= 5:
        handled |= 1 << 15  # IOCTL_DEV
    attr = _RulesetAttr(handled, 0, 0)
    size = 8
    if abi >= 4:
        attr.handled_access_net = 1 | 2  # BIND_TCP | CONNECT_TCP: no rule, so both denied
        size = 16
    if abi >= 6:
        attr.scoped = 1 | 2  # ABSTRACT_UNIX_SOCKET | SIGNAL
        size = 24
    libc = _LIBC or _libc()
    ruleset = libc.syscall(
        _SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)
    )
    if ruleset < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock_create_ruleset: {os.strerror(err)}")
    try:
        allowed = handled & ~(
            _FS_EXECUTE
            | _FS_MAKE_CHAR
            | _FS_MAKE_SOCK
            | _FS_MAKE_FIFO
            | _FS_MAKE_BLOCK
            | _FS_MAKE_SYM
        )
        dfd = os.open(workspace, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            rule = _PathBeneathAttr(allowed, dfd)
            if (
                libc.syscall(
                    _SYS_LANDLOCK_ADD_RULE,
                    ctypes.c_int(ruleset),
                    ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH),
                    ctypes.byref(rule),
                    ctypes.c_uint32(0),
                )
                != 0
            ):
                err = ctypes.get_errno()
                raise OSError(err, f"landlock_add_rule: {os.strerror(err)}")
        finally:
            os.close(dfd)
        if (
            libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
            != 0
        ):
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(ruleset)
    LANDLOCK_STATUS = f"enforced (ABI {abi})"
    return LANDLOCK_STATUS


def build_seccomp_filter(own_pid: int = 0) -> Any:
    """The worker's seccomp filter (default allow, deny-list with EPERM, plus the IPC and
    own-process rules of :mod:`.syscalls`; other architectures killed by libseccomp's bad-arch
    action). Built once in the zygote, loaded per child. ``own_pid``: the worker's pid as it
    sees it (1 in its PID namespace), 0 when unknown."""
    import pyseccomp

    from sandboxd.backends.restricted import syscalls

    filt = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    # a binary tree instead of a linear chain: every later syscall of the worker pays less
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        filt.set_attr(pyseccomp.Attr.CTL_OPTIMIZE, 2)
    for name in DENIED_SYSCALLS:
        try:
            filt.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
        except (ValueError, RuntimeError, OSError):
            continue  # not a syscall on this architecture
    syscalls.add_rules(filt, own_pid)
    return filt


# ----------------------------------------------------------------- the child


@dataclass
class ChildSpec:
    """What a worker needs to confine itself for its call."""

    cgroup: str
    workspace: str
    memory_bytes: int
    cpus: float
    pids: int
    cpu_seconds: int
    max_file_bytes: int
    uid: int | None  # None: do not change identity (daemon not root)
    gid: int | None
    zygote_pid: int
    chroot: bool
    baseline_vm: int
    applied: tuple[int, float, int] | None = None
    landlock_abi: int = 0
    #: read end of the zygote's lifeline (see :mod:`.namespaces`): how a worker that is PID 1
    #: of its namespace (``getppid()`` is 0) knows the zygote is alive; None: check getppid()
    lifeline_fd: int | None = None


def close_fds(keep: list[int]) -> None:
    """stdin/stdout/stderr to /dev/null; every other descriptor but ``keep`` closed."""
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    lo = 3
    for fd in sorted(set(keep)):
        if fd >= lo:
            os.closerange(lo, fd)
            lo = fd + 1
    os.closerange(lo, 1 << 20)


def vm_size() -> int:
    """Virtual memory size of this process (the address-space baseline for RLIMIT_AS)."""
    try:
        return int(read_small("/proc/self/statm").split()[0]) * resource.getpagesize()
    except (OSError, ValueError):
        return 256 * 1024 * 1024


def prepare_worker(
    keep: list[int], layout: CgroupLayout, cgroup: str, preset: tuple[int, float, int]
) -> None:
    """Standby part (before the call is known): own session, clean descriptors, own cgroup
    with the ``preset`` limits (those of the previous call: usually the call's own)."""
    os.setsid()
    close_fds(keep)
    if layout.version:  # root, or a delegated (writable) subtree
        layout.create_and_join(cgroup)
        layout.set_limits(cgroup, *preset, fresh=True)


#: below this memory limit a worker cannot even run ``print(1)`` (it is charged ~1.5 MiB):
#: such a call is refused up front with a clear ``MemoryError`` instead of being OOM-killed
MIN_WORKER_MEMORY = 2 * 1024 * 1024


def enter_sandbox(spec: ChildSpec, layout: CgroupLayout, program: SeccompProgram) -> None:
    """Confine the worker for its call. Raises on any failure: the caller must then ``_exit``
    without running user code."""
    if spec.memory_bytes < MIN_WORKER_MEMORY:
        raise below_usage(spec.memory_bytes, OSError(errno.EBUSY, "below the worker's needs"))
    if layout.version:
        layout.set_limits(spec.cgroup, spec.memory_bytes, spec.cpus, spec.pids, spec.applied)
    if spec.chroot:
        os.chroot(spec.workspace)
        os.chdir("/")
    else:
        os.chdir(spec.workspace)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    apply_landlock("/" if spec.chroot else spec.workspace, spec.landlock_abi)
    if spec.uid is not None and spec.gid is not None:
        os.setgroups([])
        os.setresgid(spec.gid, spec.gid, spec.gid)
        os.setresuid(spec.uid, spec.uid, spec.uid)
        if os.getuid() == 0 or os.geteuid() == 0:
            raise PermissionError("could not drop root privileges")
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if spec.lifeline_fd is not None:
        from sandboxd.backends.restricted.namespaces import parent_gone

        if parent_gone(spec.lifeline_fd):
            raise RuntimeError("zygote is gone")
        os.close(spec.lifeline_fd)
    elif os.getppid() != spec.zygote_pid:
        raise RuntimeError("zygote is gone")
    cpu = max(1, spec.cpu_seconds)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (spec.baseline_vm + spec.memory_bytes,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_NPROC, (spec.pids, spec.pids))
    resource.setrlimit(resource.RLIMIT_FSIZE, (spec.max_file_bytes,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over-size writes fail with EFBIG instead
    os.environ.clear()
    program.load()
