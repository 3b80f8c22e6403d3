"""Seccomp: the worker's syscall filter, built once in the zygote (libseccomp, exported as BPF)
and installed in each worker with one ``prctl``. The IPC and own-process rules live in
:mod:`.syscalls`."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from typing import Any

from sandboxd.backends.restricted.contain import libc

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
        res = libc().prctl(
            ctypes.c_int(PR_SET_SECCOMP),
            ctypes.c_ulong(SECCOMP_MODE_FILTER),
            ctypes.c_void_p(ctypes.addressof(self._prog)),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        )
        if res != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"seccomp: {os.strerror(err)}")


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
