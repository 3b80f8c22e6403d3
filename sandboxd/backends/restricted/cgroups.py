"""Per-call cgroups of the restricted backend (v1 and v2 share this code path).

:class:`CgroupLayout` says where the instance directory ``sandboxd-<instance>`` lives (one per
controller on v1, one on v2), creates a worker's cgroup, sets its limits, reads its peak memory
and OOM count and removes it. On v2 the subtree it lives in comes from
:mod:`sandboxd.backends.restricted.cgroup_v2` (the only version-specific part).

String paths, not pathlib, in what runs per call: the zygote and its workers share heap pages,
and every page Python code touches costs a copy-on-write fault.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandboxd.backends.restricted import cgroup_v2


def own_cgroups() -> dict[str, str]:
    """controller -> path of this process (v1 lines ``N:ctrl,ctrl:/path``; v2 key ``""``)."""
    out: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, path = parts
        if ctrls == "":
            out[""] = path
        for ctrl in ctrls.split(","):
            if ctrl:
                out[ctrl] = path
    return out


def write(path: Path | str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


@dataclass
class CgroupLayout:
    """Where per-call cgroups live. ``version`` 0 means no cgroup confinement available.

    The instance directory ``sandboxd-<instance>`` is nested under the daemon's own cgroup of
    each controller (a delegated subtree on v2), so that the daemon's own limits still apply.
    """

    version: int = 0
    bases: dict[str, Path] = field(default_factory=dict)  # v1: controller -> dir; v2: "" -> dir
    detail: str = ""

    CONTROLLERS = ("memory", "cpu", "pids")

    @classmethod
    def detect(cls, cgroup_root: Path, instance: str) -> CgroupLayout:
        """Find (and create) the instance directories; never raises.

        v1: below the daemon's own cgroup of each controller. v2: below the subtree
        :func:`sandboxd.backends.restricted.cgroup_v2.acquire` obtains for this process (its own
        cgroup when delegated to it, else a transient systemd scope with ``Delegate=yes``, else
        a private leaf layout)."""
        name = f"sandboxd-{instance}"
        own = own_cgroups()
        try:
            if (cgroup_root / "memory").is_dir() and "memory" in own:
                bases = {}
                for ctrl in cls.CONTROLLERS:
                    rel = own.get(ctrl, "/").lstrip("/")
                    base = cgroup_root / ctrl / rel / name
                    base.mkdir(exist_ok=True)
                    bases[ctrl] = base
                return cls(1, bases, "cgroup v1")
            if (cgroup_root / "cgroup.controllers").exists() and "" in own:
                subtree = cgroup_v2.acquire(cgroup_root, instance)
                base = subtree.path / name
                base.mkdir(exist_ok=True)
                write(base / "cgroup.subtree_control", cgroup_v2.ENABLE)
                return cls(2, {"": base}, f"cgroup v2 ({subtree.how})")
        except (OSError, cgroup_v2.CgroupUnavailable) as exc:
            return cls(0, {}, f"cgroups unavailable: {exc}")
        return cls(0, {}, "cgroups unavailable: no memory controller found")

    def dirs(self, call_id: str) -> list[Path]:
        """The cgroup directories of one call (one per controller on v1)."""
        return [base / call_id for base in self.bases.values()]

    def create_and_join(self, name: str) -> None:
        """In the (root) worker: create its cgroup(s) and move itself in; limits come later."""
        dirs = self.dirs(name)
        for d in dirs:
            with contextlib.suppress(FileExistsError):
                os.mkdir(d)
        for d in dirs:
            write(f"{d}/cgroup.procs", "0")

    def set_limits(
        self,
        name: str,
        memory_bytes: int,
        cpus: float,
        pids: int,
        applied: tuple[int, float, int] | None = None,
        fresh: bool = False,
    ) -> None:
        """Set the call's limits on the worker's cgroup (before any user code runs).
        ``applied``: limits already set (by the standby); only differences are written.
        ``fresh``: the cgroup was just created (no memory limit yet: nothing to read).
        String paths, not pathlib: this runs in every worker, where each page of the zygote's
        heap that Python code touches costs a copy-on-write fault."""
        quota = max(1000, int(cpus * 100_000))
        if applied == (memory_bytes, cpus, pids):
            return
        if self.version == 1:
            mem = f"{self.bases['memory']}/{name}"
            # memsw must stay >= limit: order the two writes by direction
            if applied is not None:
                current = applied[0]
            elif fresh:
                current = memory_bytes + 1  # unlimited
            else:
                current = int(read_small(f"{mem}/memory.limit_in_bytes"))
            order = ["memory.memsw.limit_in_bytes", "memory.limit_in_bytes"]
            if memory_bytes < current:
                order.reverse()
            for fname in order:
                try:
                    write(f"{mem}/{fname}", str(memory_bytes))
                except OSError as exc:
                    if fname != "memory.memsw.limit_in_bytes":
                        raise below_usage(memory_bytes, exc) from exc
            write(f"{self.bases['cpu']}/{name}/cpu.cfs_quota_us", str(quota))
            write(f"{self.bases['pids']}/{name}/pids.max", str(pids))
        elif self.version == 2:
            d = f"{self.bases['']}/{name}"
            try:
                write(f"{d}/memory.max", str(memory_bytes))
            except OSError as exc:
                raise below_usage(memory_bytes, exc) from exc
            with contextlib.suppress(OSError):
                write(f"{d}/memory.swap.max", "0")
            write(f"{d}/cpu.max", f"{quota} 100000")
            write(f"{d}/pids.max", str(pids))

    def stats(self, call_id: str) -> tuple[int, bool, bool]:
        """``(peak memory bytes, oom killed, empty)`` of a finished call's cgroup (0/False
        when unknown; ``empty``: no process left in any of its controllers)."""
        peak, oom = 0, False
        try:
            if self.version == 1:
                mem = f"{self.bases['memory']}/{call_id}"
                peak = int(read_small(f"{mem}/memory.max_usage_in_bytes"))
                events = read_small(f"{mem}/memory.oom_control")
            else:
                d = f"{self.bases['']}/{call_id}"
                with contextlib.suppress(OSError):
                    peak = int(read_small(f"{d}/memory.peak"))
                events = read_small(f"{d}/memory.events")
            for line in events.splitlines():
                if line.startswith("oom_kill "):
                    oom = int(line.split()[1]) > 0
        except (OSError, ValueError):
            pass
        empty = all(not _read_or_empty(f"{d}/cgroup.procs").strip() for d in self._dirs(call_id))
        return peak, oom, empty

    def peak_memory(self, call_id: str) -> int:
        """Peak memory bytes of a live call's cgroup so far (0 when unknown): one read."""
        path = (f"{self.bases['memory']}/{call_id}/memory.max_usage_in_bytes"
                if self.version == 1 else f"{self.bases['']}/{call_id}/memory.peak")
        try:
            return int(read_small(path))
        except (OSError, ValueError, KeyError):
            return 0

    def _dirs(self, call_id: str) -> list[str]:
        """The call's cgroup directories as plain strings (see the module docstring)."""
        return [f"{base}/{call_id}" for base in self.bases.values()]

    def remove(self, call_id: str, timeout: float = 2.0) -> bool:
        """Kill anything left in the call's cgroup(s) and remove them; True when all are gone."""
        ok = True
        for d in self._dirs(call_id):
            ok = remove_cgroup_dir(d, timeout) and ok
        return ok

    def remove_bases(self) -> bool:
        """Remove the (empty) instance directories themselves; True when all are gone."""
        ok = True
        for base in self.bases.values():
            ok = remove_cgroup_dir(base, 0.5) and ok
        return ok

    def sweep(self) -> list[str]:
        """Remove leftover call cgroups of this instance (after a crash); returns their names."""
        removed: list[str] = []
        for base in self.bases.values():
            try:
                entries = [p for p in base.iterdir() if p.is_dir()]
            except OSError:
                continue
            for d in entries:
                if remove_cgroup_dir(d):
                    removed.append(d.name)
        return sorted(set(removed))


def read_small(path: str) -> str:
    """The first 4 KiB of a (proc or cgroup) file."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096).decode()
    finally:
        os.close(fd)


def _read_or_empty(path: str) -> str:
    try:
        return read_small(path)
    except OSError:
        return ""


def below_usage(memory_bytes: int, exc: OSError) -> BaseException:
    if exc.errno == errno.EBUSY:
        return MemoryError(
            f"a memory limit of {memory_bytes} bytes is below what the python worker needs to start"
        )
    return exc


def cgroup_pids(d: Path | str) -> list[int]:
    try:
        with open(f"{d}/cgroup.procs") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def remove_cgroup_dir(d: Path | str, timeout: float = 2.0) -> bool:
    """SIGKILL whatever is still in cgroup ``d`` and ``rmdir`` it (retrying while the kernel
    finishes tearing processes down). True when the directory no longer exists."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.rmdir(d)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                return False
        for pid in cgroup_pids(d):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
