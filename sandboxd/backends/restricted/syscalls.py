"""Seccomp rules of the worker beyond the plain deny-list of :mod:`.confine`.

* **No SysV/POSIX IPC**: ``shmget``/``shmat``/``semget``/``msgget``... and ``mq_open`` are
  refused (EPERM), so no call can leave a segment, semaphore or queue behind - the worker's
  private IPC namespace (:mod:`.namespaces`) is the second wall.
* **Own process only**: the syscalls that change another process's limits or scheduling
  (``prlimit64``, ``setpriority``, ``sched_set*``, ``ioprio_set``) are allowed only on the
  caller itself: a pid argument of 0, or the caller's own pid (1 inside its PID namespace).
  Signals (``kill``, ``tgkill``...) are denied outright by the deny-list.

A pid argument is compared as an unsigned 64-bit value: "greater than the own pid" also
covers negative values and values with high bits set (the kernel truncates them to ``pid_t``).
"""

from __future__ import annotations

import errno
from typing import Any

#: SysV IPC and POSIX message queues (``ipc`` is the multiplexer of some architectures)
IPC_SYSCALLS = (
    "shmget",
    "shmat",
    "shmctl",
    "shmdt",
    "semget",
    "semop",
    "semctl",
    "semtimedop",
    "semtimedop_time64",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "ipc",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedsend_time64",
    "mq_timedreceive",
    "mq_timedreceive_time64",
    "mq_notify",
    "mq_getsetattr",
)

#: syscall -> index of its pid argument (refused unless it names the caller)
PID_ARG_SYSCALLS = {
    "prlimit64": 0,
    "sched_setscheduler": 0,
    "sched_setparam": 0,
    "sched_setaffinity": 0,
    "sched_setattr": 0,
}
#: syscall -> (index of ``which``, the only allowed ``which``, index of ``who``)
WHICH_WHO_SYSCALLS = {
    "setpriority": (0, 0, 1),  # PRIO_PROCESS only (not PRIO_PGRP, PRIO_USER)
    "ioprio_set": (0, 1, 1),  # IOPRIO_WHO_PROCESS only (not _PGRP, _USER)
}


def add_rules(filt: Any, own_pid: int) -> None:
    """Add the IPC and own-process rules to a libseccomp filter whose default is ALLOW.
    ``own_pid``: the caller's pid as it sees it (1 in a PID namespace; 0 when unknown, which
    leaves only the "0 = myself" form)."""
    import pyseccomp

    deny = pyseccomp.ERRNO(errno.EPERM)
    arch = pyseccomp.system_arch()

    def rule(name: str, *args: Any) -> None:
        if pyseccomp.resolve_syscall(arch, name) < 0:
            return  # not a syscall on this architecture
        filt.add_rule(deny, name, *args)  # anything else is an error: no silent gap

    for name in IPC_SYSCALLS:
        rule(name)
    for name, index in PID_ARG_SYSCALLS.items():
        rule(name, pyseccomp.Arg(index, pyseccomp.GT, own_pid))
    for name, (which, allowed, who) in WHICH_WHO_SYSCALLS.items():
        rule(name, pyseccomp.Arg(which, pyseccomp.NE, allowed))
        rule(name, pyseccomp.Arg(who, pyseccomp.GT, own_pid))
