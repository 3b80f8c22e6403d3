"""Process and cgroup bookkeeping for the crash and drain tests (psutil + the cgroup fs)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class ProcId:
    """A process identity that survives pid reuse."""

    pid: int
    create_time: float
    cmdline: str

    def alive(self) -> bool:
        """True while this very process exists and is not a zombie."""
        try:
            p = psutil.Process(self.pid)
            return p.create_time() == self.create_time and p.status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return False


def descendants(pid: int) -> list[ProcId]:
    """Every live descendant of ``pid``."""
    out = []
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for child in children:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            out.append(ProcId(child.pid, child.create_time(), " ".join(child.cmdline())[:120]))
        except psutil.Error:
            continue
    return out


def _v1_mounts() -> dict[str, Path]:
    """controller -> mount point, for cgroup v1 hierarchies."""
    mounts: dict[str, Path] = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup":
            for opt in parts[3].split(","):
                mounts.setdefault(opt, Path(parts[1]))
    return mounts


def cgroup_dirs(pid: int) -> set[Path]:
    """The cgroup directories (v1 controllers and/or v2) that ``pid`` is in."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return set()
    mounts = _v1_mounts()
    dirs: set[Path] = set()
    for line in text.splitlines():
        hid, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if hid == "0" and not controllers:
            if (CGROUP_ROOT / "cgroup.controllers").exists():
                dirs.add(CGROUP_ROOT / rel)
            continue
        for controller in controllers.split(","):
            if controller in ("memory", "pids", "cpu", "cpuacct") and controller in mounts:
                dirs.add(mounts[controller] / rel)
    return dirs


def wait_for(condition, timeout: float, what: str, interval: float = 0.1):  # type: ignore[no-untyped-def]
    """Poll ``condition()`` until truthy; return its value or raise AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def audit_verify(path: Path) -> subprocess.CompletedProcess[str]:
    """``sandboxd audit verify PATH`` as an admin would run it."""
    return subprocess.run(
        [sys.executable, "-m", "sandboxd", "audit", "verify", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def still_alive(procs: Iterable[ProcId]) -> list[ProcId]:
    return [p for p in procs if p.alive()]


def busy_descendants(pid: int, count: int, sample_s: float = 0.5) -> list[ProcId]:
    """Descendants of ``pid`` that burn CPU right now (at least ``count`` of them, else [])."""
    before: dict[ProcId, float] = {}
    for p in descendants(pid):
        try:
            before[p] = psutil.Process(p.pid).cpu_times().user
        except psutil.Error:
            continue
    time.sleep(sample_s)
    busy = []
    for p, t0 in before.items():
        try:
            if psutil.Process(p.pid).cpu_times().user > t0:
                busy.append(p)
        except psutil.Error:
            continue
    return busy if len(busy) >= count else []
