"""The host's memory as the kernel reports it: ``/proc/meminfo`` and, when the daemon runs in
a cgroup v2 subtree with a ``memory.max``, the room left under the tightest such limit (a
systemd unit's ``MemoryMax=``): what a new sandbox can really use is the smaller of the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MEMINFO = Path("/proc/meminfo")
SELF_CGROUP = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class MemoryReading:
    """Bytes the host has (``total``) and could give now without swapping (``available``);
    ``source`` names what bounded them (``meminfo`` or the limiting cgroup's path)."""

    total: int
    available: int
    source: str


def _meminfo(path: Path) -> tuple[int, int]:
    fields: dict[str, int] = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemTotal", "MemAvailable"):
            fields[name] = int(rest.split()[0]) * 1024
    return fields["MemTotal"], fields.get("MemAvailable", fields["MemTotal"])


def _own_cgroup(self_cgroup: Path) -> str | None:
    """The daemon's cgroup v2 path (``0::/...``), or None on a host without one."""
    try:
        for line in self_cgroup.read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].strip() or "/"
    except OSError:
        return None
    return None


def _cgroup_room(root: Path, own: str) -> tuple[int, int, str] | None:
    """(limit, room, path) of the tightest ``memory.max`` from the daemon's cgroup up."""
    best: tuple[int, int, str] | None = None
    parts = [p for p in own.split("/") if p]
    for depth in range(len(parts), 0, -1):
        path = "/" + "/".join(parts[:depth])
        directory = root / path.lstrip("/")
        try:
            limit_text = (directory / "memory.max").read_text().strip()
            if limit_text == "max":
                continue
            limit = int(limit_text)
            current = int((directory / "memory.current").read_text().strip())
        except (OSError, ValueError):
            continue
        room = max(limit - current, 0)
        if best is None or room < best[1]:
            best = (limit, room, path)
    return best


def read_memory(cgroup_root: Path = Path("/sys/fs/cgroup"), *, meminfo: Path = MEMINFO,
                self_cgroup: Path = SELF_CGROUP) -> MemoryReading:
    """The memory a new sandbox can use now (a few file reads: cheap enough for every
    admission, and never stale)."""
    total, available = _meminfo(meminfo)
    own = _own_cgroup(self_cgroup)
    limited = _cgroup_room(cgroup_root, own) if own else None
    if limited is not None and limited[1] < available:
        return MemoryReading(min(total, limited[0]), limited[1], f"cgroup {limited[2]}")
    return MemoryReading(total, available, "meminfo")
