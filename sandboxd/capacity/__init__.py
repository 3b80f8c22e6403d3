"""What this host can hold, from its memory rather than from constants.

:mod:`sandboxd.util.memory` measures the memory the host (or the daemon's cgroup, if it is
limited) has and has free; :mod:`sandboxd.config.derived` derives the caps an admin did not set
(``max_kernels``, the sandbox uid range) from the memory the host has, when the settings are
made; :mod:`.admission` refuses a new session or kernel
while the measured headroom is below the reserve (503 ``host-full`` with ``Retry-After``
naming what is full) and reports ``GET /v1/capacity`` and its ``/metrics`` gauges.
"""

from __future__ import annotations

from sandboxd.capacity.admission import Capacity
from sandboxd.util.memory import MemoryReading, read_memory

__all__ = ["Capacity", "MemoryReading", "read_memory"]
