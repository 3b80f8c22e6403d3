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

One module per mechanism: :mod:`.cgroups` (with :mod:`.cgroup_v2`), :mod:`.contain` (session,
descriptors, chroot, privileges, zygote tie, rlimits), :mod:`.landlock`, :mod:`.seccomp` (with
:mod:`.syscalls`) and :mod:`.namespaces`; this module keeps the order.

Threads: the filter denies ``clone``/``clone3``/``fork``/``vfork`` outright, so user code can
neither start processes nor threads (a thread could otherwise outlive its call's output
accounting); the worker is single-threaded by construction.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from sandboxd.backends.restricted import contain, landlock
from sandboxd.backends.restricted.cgroups import CgroupLayout, below_usage
from sandboxd.backends.restricted.seccomp import SeccompProgram
from sandboxd.protocol.limits import Limits


@dataclass
class ChildSpec:
    """What a worker needs to confine itself for its call."""

    cgroup: str
    workspace: str
    limits: Limits  # the call's (memory, CPU share and pids go to its cgroup too)
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
    #: RLIMIT_CPU hard limit (None: one second above the soft one; see ``set_rlimits``)
    cpu_hard: int | None = None


def prepare_worker(
    keep: list[int], layout: CgroupLayout, cgroup: str, preset: tuple[int, float, int]
) -> None:
    """Standby part (before the call is known): own session, clean descriptors, own cgroup
    with the ``preset`` limits (those of the previous call: usually the call's own)."""
    os.setsid()
    contain.close_fds(keep)
    if layout.version:  # root, or a delegated (writable) subtree
        layout.create_and_join(cgroup)
        layout.set_limits(cgroup, *preset, fresh=True)


#: below this memory limit a worker cannot even run ``print(1)`` (it is charged ~1.5 MiB):
#: such a call is refused up front with a clear ``MemoryError`` instead of being OOM-killed
MIN_WORKER_MEMORY = 2 * 1024 * 1024


def enter_sandbox(spec: ChildSpec, layout: CgroupLayout, program: SeccompProgram) -> None:
    """Confine the worker for its call. Raises on any failure: the caller must then ``_exit``
    without running user code."""
    limits = spec.limits
    if limits.memory_bytes < MIN_WORKER_MEMORY:
        raise below_usage(limits.memory_bytes, OSError(errno.EBUSY, "below the worker's needs"))
    if layout.version:
        layout.set_limits(spec.cgroup, limits.memory_bytes, limits.cpus, limits.pids,
                          spec.applied)
    root = contain.enter_workspace(spec.workspace, spec.chroot)
    contain.prctl(contain.PR_SET_NO_NEW_PRIVS, 1)
    landlock.apply_landlock(root, spec.landlock_abi)
    if spec.uid is not None and spec.gid is not None:
        contain.drop_privileges(spec.uid, spec.gid)
    contain.tie_to_zygote(spec.zygote_pid, spec.lifeline_fd)
    contain.set_rlimits(
        spec.cpu_seconds, spec.baseline_vm, limits.memory_bytes, limits.pids,
        spec.max_file_bytes, limits.rlimits(), spec.cpu_hard,
    )
    os.environ.clear()
    program.load()
