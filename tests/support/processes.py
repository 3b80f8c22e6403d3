"""Ask whether a process of a sandbox is still there: the one way every test asks."""

from __future__ import annotations

import psutil


def running(proc: int | psutil.Process) -> bool:
    """True while ``proc`` (a pid, or a process whose identity psutil checks) runs and is not
    a zombie.

    A process may end between any two ``/proc`` reads, so a check made in two steps
    (``pid_exists`` and then ``status``) can raise ``NoSuchProcess`` in between. Its end is
    the answer here, never an error.
    """
    try:
        p = proc if isinstance(proc, psutil.Process) else psutil.Process(proc)
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # psutil.ZombieProcess is one too
        return False
