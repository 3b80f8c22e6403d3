"""The fork side of a process that runs a caller's code: the set-up every call's worker and
kernel shares (the first to die when memory runs out, default signals, the call's rlimits),
and, for a language kernel that runs another program (bash, node), its descriptors placed
where its program reads them and every other closed, and the exec confinement (Landlock:
only its own programs may be executed) before the exec."""

from __future__ import annotations

import fcntl
import os
import signal
from collections.abc import Iterable, Sequence

from .landlock import restrict_exec
from .rlimits import Rlimits, apply_rlimits


def place_fds(fds: dict[int, int], close: Iterable[tuple[int, int]]) -> None:
    """Each ``fds`` target made a copy of its source (through descriptors above 200, so that
    no target overwrites a source still to be copied), then the ``close`` ranges closed (the
    channel's descriptors among them)."""
    high = {fd: fcntl.fcntl(src, fcntl.F_DUPFD_CLOEXEC, 200) for fd, src in fds.items()}
    for fd, src in high.items():
        os.dup2(src, fd, inheritable=True)
    for low, high_end in close:
        os.closerange(low, high_end)


def reset_child(cwd: str, rlimits: Rlimits) -> None:
    """What every process that runs a caller's code sets before it (a call's worker, a
    kernel): the first to die when memory runs out, default signals, umask, the working
    directory and the call's rlimits (each process it starts inherits them)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:
        pass
    for sig in (signal.SIGPIPE, signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    os.umask(0o022)
    os.chdir(cwd)
    apply_rlimits(rlimits)


def confine_child(what: str, cwd: str, rlimits: Rlimits, programs: Sequence[str],
                  path: str) -> None:
    """The rest of a kernel's set-up before its exec: :func:`reset_child`, then only its own
    ``programs`` may be executed; ``what`` names the kernel in the error when they cannot be
    confined."""
    reset_child(cwd, rlimits)
    problem = restrict_exec(list(programs), path)
    if problem is not None:
        raise OSError(1, f"the {what} kernel cannot be confined: {problem}")
