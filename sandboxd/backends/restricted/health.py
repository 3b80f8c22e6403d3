"""The zygote's health, checked by the daemon: a zygote that does not answer a ping within
:data:`PING_TIMEOUT_S` (stopped, deadlocked, swapped out) is *retired*: new calls go to a new
zygote at once, and the old one is killed as soon as its in-flight calls are over (they end by
their deadlines: the daemon kills a worker itself, through its pidfd, when no exit report
comes, and verifies that nothing is left: process dead, cgroup removed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any, Protocol

from sandboxd.host.procinfo import pidfd_dead

#: how often the daemon pings its zygote, and how long an answer may take
HEALTH_INTERVAL_S = 1.0
PING_TIMEOUT_S = 1.5
#: how long a finished worker's exit report may take before the daemon reaps it itself
#: (longer than one health check, so that a hung zygote is known by then)
EXIT_REPORT_S = HEALTH_INTERVAL_S + PING_TIMEOUT_S + 1.0


class Worker(Protocol):
    pid: int
    pidfd: int | None
    cgroup: str
    exited: asyncio.Future[dict[str, Any]]


class Zygote(Protocol):
    hung: asyncio.Event


async def exit_report(zygote: Zygote, worker: Worker) -> dict[str, Any] | None:
    """The zygote's exit report of ``worker`` (raises what the zygote's death set), or None
    when it does not come within :data:`EXIT_REPORT_S` or the zygote is known to be hung."""
    hung = asyncio.ensure_future(zygote.hung.wait())
    either: set[asyncio.Future[Any]] = {worker.exited, hung}
    try:
        await asyncio.wait(either, timeout=EXIT_REPORT_S,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        hung.cancel()
    if worker.exited.done():
        return worker.exited.result()
    return None


def _kill_and_wait(pid: int, pidfd: int | None, timeout: float) -> bool:
    """SIGKILL the worker (and its process group when it leads one); True once it is dead."""
    if pidfd is None:
        return False
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    # the worker is not reaped while its zygote hangs, so its pid cannot be reused meanwhile
    with contextlib.suppress(OSError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
    return pidfd_dead(pidfd, timeout)


async def reap_ourselves(worker: Worker, layout: Any) -> dict[str, Any]:
    """No exit report: kill the worker, wait for its death, remove its cgroup ourselves.
    Returns an exit report of our own (``daemon_verified``)."""
    dead = await asyncio.to_thread(_kill_and_wait, worker.pid, worker.pidfd, 2.0)
    removed = True
    if layout.version:
        removed = await asyncio.to_thread(layout.remove, worker.cgroup, 1.0)
    return {"daemon_verified": True, "dead": dead, "cgroup_empty": removed}


def verify_ourselves(info: dict[str, Any]) -> tuple[bool, str | None]:
    """The cleanup proof of a report made by :func:`reap_ourselves`."""
    problems = []
    if not info.get("dead"):
        problems.append("the worker could not be proven dead (no exit report from the zygote)")
    if not info.get("cgroup_empty"):
        problems.append("the worker's cgroup could not be removed")
    if problems:
        return False, "; ".join(problems)
    return True, "the zygote did not report; the daemon killed the worker and removed its cgroup"
