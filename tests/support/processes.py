"""Ask whether a process of a sandbox is still there: the one way every test asks."""

from __future__ import annotations

import time

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


def descendants(pid: int) -> list[psutil.Process]:
    """Every descendant of ``pid`` (none once it has ended)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def busy_descendants(pid: int, window_s: float = 1.0) -> list[psutil.Process]:
    """The descendants of ``pid`` that burn CPU over a ``window_s`` window (more than a quarter
    of it), the busiest first. A worker in a busy loop uses the whole window; an idle zygote
    or standby worker next to nothing. CPU time grown, not CPU time total: under emulation
    the zygote's imports alone take seconds."""
    def cpu() -> dict[psutil.Process, float]:
        times: dict[psutil.Process, float] = {}
        for child in descendants(pid):
            try:
                t = child.cpu_times()
            except psutil.Error:  # it ended meanwhile
                continue
            times[child] = t.user + t.system
        return times

    before = cpu()
    time.sleep(window_s)  # sleep-ok: the CPU window the measurement is taken over
    after = cpu()
    grown = {p: t - before.get(p, t) for p, t in after.items()}
    return sorted((p for p, g in grown.items() if g > window_s / 4), key=grown.__getitem__,
                  reverse=True)
