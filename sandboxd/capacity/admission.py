"""Admission by measured memory headroom, and the host's capacity as ``GET /v1/capacity`` and
``/metrics`` report it.

A new session, or a call that would start a kernel, is admitted only while the memory the host
can give now (:func:`~sandboxd.util.memory.read_memory`), less ``kernel_memory_bytes`` for
each kernel being started by calls in flight, stays above ``memory_reserve_bytes`` after it:
else 503 ``host-full`` (``full: "memory"``) with ``Retry-After``. The check is synchronous and
made with the caps' reservations (:mod:`sandboxd.util.reservations`), before any await, so a burst
cannot pass it together. A full host refuses what is new; what it admitted goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Gauge

from sandboxd.errors import HostFull
from sandboxd.util.memory import MEMINFO, MemoryReading, read_memory

if TYPE_CHECKING:
    from sandboxd.config import Settings
    from sandboxd.host.uids import UidPool
    from sandboxd.sessions.kernels import KernelCap
    from sandboxd.sessions.manager import SessionManager

MIB = 1024 * 1024


class Capacity:
    """The host's room for sessions and kernels: admission and the report."""

    def __init__(self, settings: Settings, *, kernels: KernelCap, sessions: SessionManager,
                 uids: UidPool | None, meminfo: Path = MEMINFO) -> None:
        self.reserve = settings.memory_reserve_bytes
        self.kernel_bytes = settings.kernel_memory_bytes
        self.derived = settings.derived
        self.cgroup_root = Path("/sys/fs/cgroup")
        self.meminfo = meminfo  # a test points it at a file it writes
        self.kernels = kernels
        self.sessions = sessions
        self.uids = uids
        self.keep_free = sessions.keep_free
        #: how many sessions are made ahead, their sandbox started (sandboxd.sessions.ready)
        self.ready: Callable[[], int] = lambda: 0

    def memory(self) -> MemoryReading:
        """The memory a new sandbox can use now."""
        return read_memory(self.cgroup_root, meminfo=self.meminfo)

    def _refuse_below_reserve(self, need: int, what: str) -> None:
        memory = self.memory()
        if memory.available - need < self.reserve:
            raise HostFull(
                f"the host is full: {what} needs {need // MIB} MiB of memory, but "
                f"{memory.available // MIB} MiB are free ({memory.source}) and "
                f"{self.reserve // MIB} MiB are kept in reserve (memory_reserve_bytes); retry "
                "later, or end sessions that are no longer needed", full="memory")

    def admit_session(self) -> None:
        """Refuse a new session (:class:`HostFull`) while the headroom is below the reserve.
        Synchronous: called before the first await of the creation."""
        self._refuse_below_reserve(0, "a new session")

    def admit_kernel(self, starting: int) -> None:
        """Refuse a new kernel while the headroom, less what the ``starting`` kernels of
        calls in flight will take, has no room for one more above the reserve."""
        self._refuse_below_reserve((starting + 1) * self.kernel_bytes, "a new Python kernel")

    def view(self, client: str | None = None) -> dict[str, Any]:
        """``GET /v1/capacity``: sessions, kernels, sandbox uids and memory headroom, and
        ``full``: what would refuse a new session or kernel now."""
        memory = self.memory()
        live_kernels = self.kernels.count()
        headroom = memory.available - self.reserve
        sessions = len(self.sessions.registered())
        uids = self._uids_view()
        full = [name for name, hit in (
            ("sandbox_uids", uids is not None and uids["count"] - uids["in_use"] <= self.keep_free),
            ("max_kernels", live_kernels >= self.kernels.limit),
            ("memory", headroom < self.kernel_bytes)) if hit]
        view: dict[str, Any] = {
            "sessions": {"live": sessions, "max_per_client": self.sessions.max_per_client,
                         "ready": self.ready()},
            "kernels": {"live": live_kernels, "max": self.kernels.limit,
                        "derived": "max_kernels" in self.derived,
                        "hibernated": self.kernels.hibernated()},
            "memory": {"total_bytes": memory.total, "available_bytes": memory.available,
                       "reserve_bytes": self.reserve, "headroom_bytes": max(headroom, 0),
                       "kernel_bytes": self.kernel_bytes,
                       "kernels_that_fit": max(headroom, 0) // self.kernel_bytes,
                       "source": memory.source},
            "sandbox_uids": uids,
            "full": full,
        }
        if client is not None:
            view["sessions"]["yours"] = len(self.sessions.owned(client))
        return view

    def _uids_view(self) -> dict[str, Any] | None:
        """The sandbox uid range in :meth:`view`: its size, how many are in use, whether its
        size was derived; None without a range."""
        if self.uids is None:
            return None
        return {"count": self.uids.count, "in_use": self.uids.in_use,
                "derived": "sandbox_uid_count" in self.derived}

    def register(self, registry: CollectorRegistry) -> None:
        """The same figures as ``/metrics`` gauges (read when scraped)."""
        def gauge(name: str, doc: str, value: Callable[[], float]) -> None:
            Gauge(name, doc, registry=registry).set_function(value)

        gauge("sandboxd_sessions_live", "Live sessions, every client",
              lambda: len(self.sessions.registered()))
        gauge("sandboxd_sessions_ready", "Sessions made ahead with their sandbox started, "
              "for clients' next new sessions", lambda: self.ready())
        gauge("sandboxd_kernels_live", "Live session kernels (and those being started)",
              self.kernels.count)
        gauge("sandboxd_kernels_hibernated", "Session kernels asleep on disk (they hold no "
              "memory and do not count against max_kernels)", self.kernels.hibernated)
        gauge("sandboxd_kernels_max", "max_kernels (derived from memory unless set)",
              lambda: self.kernels.limit)
        gauge("sandboxd_memory_available_bytes", "Memory a new sandbox could use now",
              lambda: self.memory().available)
        gauge("sandboxd_memory_headroom_bytes",
              "Available memory above memory_reserve_bytes (a new session or kernel needs "
              "room here)", lambda: max(self.memory().available - self.reserve, 0))
        if self.uids is not None:
            uids = self.uids
            gauge("sandboxd_sandbox_uids_in_use", "Sandbox uids held by live sandboxes",
                  lambda: uids.in_use)
            gauge("sandboxd_sandbox_uids", "Sandbox uids of the range", lambda: uids.count)
