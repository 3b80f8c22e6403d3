"""Run a command under the syscall-level confinement that ``systemd/sandboxd.service`` asks
systemd for, without systemd: the tests cannot start units here (systemd is not PID 1), but
they can load the same seccomp filters and exec the daemon under them.

Emulated, read from the unit file itself: ``SystemCallFilter=`` (allow list minus the ``~``
groups, expanded with ``systemd-analyze syscall-filter``), ``SystemCallErrorNumber=``,
``MemoryDenyWriteExecute=`` (systemd's three rules: no W+X ``mmap``, no ``mprotect`` /
``pkey_mprotect`` to X, no ``shmat`` with ``SHM_EXEC``), ``RestrictAddressFamilies=``
(``socket()`` of another family fails with ``EAFNOSUPPORT``), ``RestrictNamespaces=yes``
(``unshare``/``setns`` fail), ``NoNewPrivileges=`` (implied by loading a filter),
``CapabilityBoundingSet=`` (every other capability is dropped from the bounding set, so the
exec'd root process holds exactly those) and ``User=``: with ``--user UID:GID`` the launcher
drops to that identity first (``setgroups([])``, ``setresgid``, ``setresuid``). It first joins
the cgroup directories given with ``--cgroup DIR`` (the service's own cgroup, as systemd
creates it for ``Delegate=yes``).

    python unit_sandbox.py [--unit FILE] [--dropin FILE]... [--user UID:GID] [--cgroup DIR]...
        -- COMMAND [ARGS...]
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import socket
import subprocess
import sys
from functools import cache
from pathlib import Path

import pyseccomp as seccomp

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "sandboxd.service"
PROT_WRITE = mmap.PROT_WRITE
PROT_EXEC = mmap.PROT_EXEC
SHM_EXEC = 0o100000
FAMILIES = {
    "AF_UNIX": socket.AF_UNIX,
    "AF_INET": socket.AF_INET,
    "AF_INET6": socket.AF_INET6,
    "AF_NETLINK": socket.AF_NETLINK,
    "AF_PACKET": socket.AF_PACKET,
}


def unit_settings(path: Path = UNIT, dropins: tuple[Path, ...] = ()) -> dict[str, list[str]]:
    """``[Service]`` key -> values (repeated keys kept in order), drop-ins applied after the
    unit. An empty assignment resets the list, as in systemd."""
    out: dict[str, list[str]] = {}
    section = None
    lines = [ln for f in (path, *dropins) for ln in f.read_text().splitlines()]
    for raw in lines:
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section == "Service" and "=" in line:
            key, value = line.split("=", 1)
            if value == "" and key != "CapabilityBoundingSet":
                out[key] = []
            else:
                out.setdefault(key, []).append(value)
    return out


@cache
def expand(group: str) -> frozenset[str]:
    """The syscall names of a systemd syscall group (nested groups expanded)."""
    proc = subprocess.run(
        ["systemd-analyze", "syscall-filter", group], capture_output=True, text=True, check=True
    )
    names: set[str] = set()
    for line in proc.stdout.splitlines()[1:]:
        item = line.strip()
        if not item or item.startswith("#"):
            continue
        names |= expand(item) if item.startswith("@") else {item}
    return frozenset(names)


def _names(items: list[str]) -> set[str]:
    out: set[str] = set()
    for item in items:
        out |= expand(item) if item.startswith("@") else {item}
    return out


def allowed_syscalls(settings: dict[str, list[str]]) -> set[str]:
    """The effective allow list of ``SystemCallFilter=`` lines (first an allow list, then
    ``~`` lines removing names from it, as systemd composes them)."""
    allowed: set[str] = set()
    for value in settings.get("SystemCallFilter", []):
        if value.startswith("~"):
            allowed -= _names(value[1:].split())
        else:
            allowed |= _names(value.split())
    return allowed


def _resolvable(name: str) -> bool:
    try:
        seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
    except (ValueError, RuntimeError, OSError):
        return False
    return True


def build_filters(settings: dict[str, list[str]]) -> list[seccomp.SyscallFilter]:
    """The seccomp filters systemd would load for the unit (loaded in order, they stack)."""
    filters = []
    err = getattr(errno, settings.get("SystemCallErrorNumber", ["EPERM"])[-1])
    allow = allowed_syscalls(settings)
    if allow:
        f = seccomp.SyscallFilter(seccomp.ERRNO(err))
        for name in sorted(allow):
            if _resolvable(name):
                with contextlib.suppress(OSError):  # a name of another ABI (socketcall...)
                    f.add_rule(seccomp.ALLOW, name)
        filters.append(f)
    if settings.get("MemoryDenyWriteExecute", ["no"])[-1] == "yes":
        f = seccomp.SyscallFilter(seccomp.ALLOW)
        wx = PROT_WRITE | PROT_EXEC
        f.add_rule(seccomp.ERRNO(errno.EPERM), "mmap", seccomp.Arg(2, seccomp.MASKED_EQ, wx, wx))
        for name in ("mprotect", "pkey_mprotect"):
            if _resolvable(name):
                f.add_rule(
                    seccomp.ERRNO(errno.EPERM),
                    name,
                    seccomp.Arg(2, seccomp.MASKED_EQ, PROT_EXEC, PROT_EXEC),
                )
        f.add_rule(
            seccomp.ERRNO(errno.EPERM),
            "shmat",
            seccomp.Arg(2, seccomp.MASKED_EQ, SHM_EXEC, SHM_EXEC),
        )
        filters.append(f)
    families = settings.get("RestrictAddressFamilies")
    if families:
        keep = sorted({FAMILIES[n] for n in families[-1].split()})
        f = seccomp.SyscallFilter(seccomp.ALLOW)
        # allow the listed families; anything else -> EAFNOSUPPORT (as systemd does)
        lo, hi = keep[0], keep[-1]
        f.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.LT, lo))
        f.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.GT, hi))
        for fam in range(lo + 1, hi):
            if fam not in keep:
                f.add_rule(
                    seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.EQ, fam)
                )
        filters.append(f)
    if settings.get("RestrictNamespaces", ["no"])[-1] == "yes":
        f = seccomp.SyscallFilter(seccomp.ALLOW)
        for name in ("unshare", "setns"):
            f.add_rule(seccomp.ERRNO(errno.EPERM), name)
        filters.append(f)
    return filters


PR_CAPBSET_DROP = 24


def bounding_set(settings: dict[str, list[str]]) -> list[str]:
    """``CapabilityBoundingSet=`` as systemd composes it: the assignments (unit, then drop-ins)
    are ORed together; an empty one resets the set."""
    values = settings.get("CapabilityBoundingSet", [])
    last_reset = max((i for i, v in enumerate(values) if not v.strip()), default=-1)
    names: list[str] = []
    for value in values[last_reset + 1:]:
        names += [n for n in value.split() if n not in names]
    return names


def capability_numbers(names: list[str]) -> set[int]:
    """``CAP_SETUID`` ... -> kernel capability numbers (from capability.h)."""
    table = {
        "CAP_CHOWN": 0,
        "CAP_DAC_OVERRIDE": 1,
        "CAP_DAC_READ_SEARCH": 2,
        "CAP_FOWNER": 3,
        "CAP_FSETID": 4,
        "CAP_KILL": 5,
        "CAP_SETGID": 6,
        "CAP_SETUID": 7,
        "CAP_SETPCAP": 8,
        "CAP_LINUX_IMMUTABLE": 9,
        "CAP_NET_BIND_SERVICE": 10,
        "CAP_NET_BROADCAST": 11,
        "CAP_NET_ADMIN": 12,
        "CAP_NET_RAW": 13,
        "CAP_IPC_LOCK": 14,
        "CAP_IPC_OWNER": 15,
        "CAP_SYS_MODULE": 16,
        "CAP_SYS_RAWIO": 17,
        "CAP_SYS_CHROOT": 18,
        "CAP_SYS_PTRACE": 19,
        "CAP_SYS_PACCT": 20,
        "CAP_SYS_ADMIN": 21,
        "CAP_SYS_BOOT": 22,
        "CAP_SYS_NICE": 23,
        "CAP_SYS_RESOURCE": 24,
        "CAP_SYS_TIME": 25,
        "CAP_SYS_TTY_CONFIG": 26,
        "CAP_MKNOD": 27,
        "CAP_LEASE": 28,
        "CAP_AUDIT_WRITE": 29,
        "CAP_AUDIT_CONTROL": 30,
        "CAP_SETFCAP": 31,
    }
    return {table[n] for n in names}


def drop_bounding_set(keep: set[int]) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        if cap not in keep and libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"PR_CAPBSET_DROP {cap}")


def main(argv: list[str]) -> None:
    user: tuple[int, int] | None = None
    cgroups: list[Path] = []
    unit = UNIT
    dropins: list[Path] = []
    args = list(argv)
    while args and args[0] != "--":
        opt = args.pop(0)
        if opt == "--user":
            uid, gid = args.pop(0).split(":")
            user = (int(uid), int(gid))
        elif opt == "--cgroup":
            cgroups.append(Path(args.pop(0)))
        elif opt == "--unit":
            unit = Path(args.pop(0))
        elif opt == "--dropin":
            dropins.append(Path(args.pop(0)))
        else:
            raise SystemExit(f"unit_sandbox: unknown option {opt}")
    if not args or len(args) < 2:
        raise SystemExit("unit_sandbox: usage: [--user U:G] [--cgroup DIR]... -- COMMAND...")
    command = args[1:]
    settings = unit_settings(unit, tuple(dropins))
    filters = build_filters(settings)  # needs systemd-analyze: before any restriction
    for d in cgroups:
        (d / "cgroup.procs").write_text(str(os.getpid()))
    if "CapabilityBoundingSet" in settings:
        drop_bounding_set(capability_numbers(bounding_set(settings)))
    if user is not None:
        os.setgroups([])
        os.setresgid(user[1], user[1], user[1])
        os.setresuid(user[0], user[0], user[0])
    for f in filters:
        f.load()  # sets no_new_privs first (NoNewPrivileges=yes)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
