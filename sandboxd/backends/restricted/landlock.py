"""Landlock: confines the worker's filesystem to the workspace, denies TCP bind/connect and
scopes signals and abstract unix sockets (as far as the kernel's ABI allows)."""

from __future__ import annotations

import ctypes
import os

from sandboxd.backends.restricted.contain import libc

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
    res = libc().syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
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
    lib = libc()
    ruleset = lib.syscall(
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
                lib.syscall(
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
        if lib.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(ruleset)
    LANDLOCK_STATUS = f"enforced (ABI {abi})"
    return LANDLOCK_STATUS
