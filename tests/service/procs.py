"""Process and cgroup bookkeeping for the crash and drain tests (psutil + the cgroup fs)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.support import cli

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


def audit_verify(path: Path) -> subprocess.CompletedProcess[str]:
    """``sandboxd audit verify PATH`` as an admin would run it."""
    return cli.run("audit", "verify", str(path), timeout=120)


def still_alive(procs: Iterable[ProcId]) -> list[ProcId]:
    return [p for p in procs if p.alive()]


def busy_descendants(pid: int, sample_s: float = 0.5) -> list[ProcId]:
    """Descendants of ``pid`` that burn CPU right now (over a ``sample_s`` window)."""
    before: dict[ProcId, float] = {}
    for p in descendants(pid):
        try:
            before[p] = psutil.Process(p.pid).cpu_times().user
        except psutil.Error:
            continue
    time.sleep(sample_s)  # sleep-ok: the CPU window the measurement is taken over
    busy = []
    for p, t0 in before.items():
        try:
            if psutil.Process(p.pid).cpu_times().user > t0:
                busy.append(p)
        except psutil.Error:
            continue
    return busy


def workspace_of(p: ProcId, state: Path) -> Path | None:
    """The workspace a worker runs in (its cwd, under the state directory), or None."""
    try:
        cwd = Path(psutil.Process(p.pid).cwd())
    except psutil.Error:
        return None
    return cwd if cwd.is_relative_to(state / "workspaces") else None


def call_workers(pid: int, state: Path, calls: int) -> list[ProcId]:
    """The workers of ``calls`` busy calls of the daemon ``pid``: the descendants that burn
    CPU inside a workspace (pre-forked idle workers may burn CPU while they start, on a slow
    host, but outside any workspace); [] until there is one for every call."""
    busy = [p for p in busy_descendants(pid) if workspace_of(p, state) is not None]
    return busy if len(busy) >= calls else []  # count-ok: a worker per call, by what it does
