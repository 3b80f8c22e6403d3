"""cgroup v2: obtain a subtree this process may manage, without breaking anybody's rules.

cgroup v2 has two rules that decide where per-call cgroups can live:

* **no internal processes**: a cgroup that enables controllers for its children
  (``cgroup.subtree_control``) may not hold processes itself;
* **one writer per subtree**: on a systemd host, systemd owns the tree; a service may only
  manage the part systemd *delegated* to it (``Delegate=yes``).

:func:`acquire` finds or obtains such a subtree for the calling process, in this order:

1. **already ours**: the process sits in ``<subtree>/sandboxd-daemon`` (an earlier call in this
   process, e.g. a restart of the backend);
2. **its cgroup is its own**: alone in it (a unit or scope with ``Delegate=yes``), or with only
   its own descendants beside it (e.g. the workspace-quota mount helper, started earlier), or it
   is a container's cgroup (PID 1 of this PID namespace is in it: the daemon itself, or an init
   such as ``docker run --init``; everything in it belongs to the container, including short
   ``docker exec`` processes such as the image's health check): the process moves itself and
   them into the leaf ``sandboxd-daemon`` and the cgroup becomes the subtree;
3. **shared cgroup on a systemd host** (a login shell, ``make run``, a CI job, pytest): systemd
   is asked over D-Bus (``busctl``, ``StartTransientUnit``) for a transient scope with
   ``Delegate=yes`` holding just this process - what rootless container engines do. systemd
   removes the scope (and everything below it) when the process exits;
4. **shared cgroup, no systemd**: a sibling ``sandboxd-<instance>-<pid>`` of the own cgroup is
   created, the process moves into its leaf, and an exit hook moves it back and removes the
   sibling.

:func:`plan` says which of these would happen, without changing anything (``sandboxd doctor``).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sandboxd.errors import SandboxdError

WANT = ("memory", "cpu", "pids")
ENABLE = " ".join(f"+{c}" for c in WANT)
LEAF = "sandboxd-daemon"
SCOPE_WAIT_S = 10.0
TAKEOVER_TRIES = 50  # rounds of "move newcomers, enable" (~2.5 s of docker exec churn)


class CgroupUnavailable(SandboxdError, RuntimeError):
    """No cgroup v2 subtree with the memory, cpu and pids controllers can be had."""

    code = "cgroup-unavailable"


@dataclass(frozen=True)
class Subtree:
    """A cgroup directory whose children this process manages, and how it was obtained."""

    path: Path
    how: str


def own_path() -> str:
    """This process's v2 cgroup (``/system.slice/x.service``), from ``/proc/self/cgroup``."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise CgroupUnavailable("this process is in no cgroup v2 hierarchy")


def _procs(d: Path) -> set[int]:
    try:
        return {int(x) for x in (d / "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return set()


def _descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (from ``/proc/<pid>/task/*/children``)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                kids = Path(f"/proc/{p}/task/{tid}/children").read_text().split()
            except OSError:
                continue
            for k in map(int, kids):
                if k not in found:
                    found.add(k)
                    todo.append(k)
    return found


@dataclass(frozen=True)
class _Takeover:
    """Why the own cgroup may become the subtree, and which processes may be moved into its
    leaf: this process's descendants, or (``container``) every process of the container."""

    container: bool

    def may_move(self, pids: set[int]) -> bool:
        return self.container or pids <= _descendants(os.getpid())


def _own_cgroup_is_ours(own: Path, rel: str) -> _Takeover | None:
    """Whether this process may take its own cgroup over (see the module docstring, 2.), else
    ``None`` (shared with others: not delegated to us)."""
    if rel == "/":
        return None
    procs = _procs(own)
    me = os.getpid()
    if me not in procs:
        return None
    if 1 in procs:  # a container's: its init shares it (a host's sits in init.scope or the root)
        return _Takeover(container=True)
    if procs - {me} <= _descendants(me):
        return _Takeover(container=False)
    return None


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _systemd_running() -> bool:
    return Path("/run/systemd/system").is_dir() and shutil.which("busctl") is not None


def _missing_controllers(d: Path) -> list[str]:
    try:
        have = set((d / "cgroup.controllers").read_text().split())
    except OSError as exc:
        raise CgroupUnavailable(f"cannot read {d}/cgroup.controllers: {exc.strerror}") from exc
    return [c for c in WANT if c not in have]


def _enable(d: Path) -> None:
    missing = _missing_controllers(d)
    if missing:
        raise CgroupUnavailable(
            f"cgroup v2: controllers {missing} are not available in {d} "
            "(under systemd run the daemon with Delegate=yes)"
        )
    current = set((d / "cgroup.subtree_control").read_text().split())
    if not set(WANT) <= current:
        _write(d / "cgroup.subtree_control", ENABLE)


def _into_leaf(d: Path, takeover: _Takeover | None = None) -> None:
    """Move this process (and, with ``takeover``, the other processes of ``d`` it may move)
    into ``d/sandboxd-daemon`` and enable the controllers in ``d``.

    A process may join ``d`` meanwhile (``docker exec``: a health check); enabling then fails
    with EBUSY (no internal processes), and the newcomers are moved too when ``takeover``
    allows it."""
    leaf = d / LEAF
    leaf.mkdir(exist_ok=True)
    me = os.getpid()
    for attempt in range(TAKEOVER_TRIES):
        if takeover is not None:
            others = _procs(d) - {me}
            if not takeover.may_move(others):
                raise CgroupUnavailable(f"{d} is shared with processes that are not this daemon's")
            for pid in sorted(others):
                with contextlib.suppress(ProcessLookupError):  # gone meanwhile: nothing to move
                    _write(leaf / "cgroup.procs", str(pid))
        if attempt == 0:
            _write(leaf / "cgroup.procs", str(me))
        try:
            _enable(d)
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or takeover is None or attempt == TAKEOVER_TRIES - 1:
                raise
        time.sleep(0.05)


def plan(root: Path) -> str:
    """What :func:`acquire` would do for this process (no side effects)."""
    rel = own_path()
    own = root / rel.lstrip("/")
    if own.name == LEAF:
        return f"v2; already in the daemon leaf of {rel.rsplit('/', 1)[0] or '/'}"
    takeover = _own_cgroup_is_ours(own, rel)
    if takeover is not None and takeover.container:
        return (
            f"v2; own cgroup {rel} is a container's (its PID 1 is in it): used as the subtree, "
            "the container's processes moved into its leaf"
        )
    if takeover is not None:
        return f"v2; own cgroup {rel} holds only this process (and its children): used as the " \
               "subtree"
    shared = f"v2; own cgroup {rel} is shared with other processes (not delegated)"
    if _systemd_running():
        return f"{shared}: a transient systemd scope with Delegate=yes will be used"
    return f"{shared}, no systemd: a private sibling cgroup will be created (and removed at exit)"


def acquire(root: Path, instance: str) -> Subtree:
    """A subtree for this process's per-call cgroups (see the module docstring)."""
    rel = own_path()
    own = root / rel.lstrip("/")
    if own.name == LEAF:
        _enable(own.parent)
        return Subtree(own.parent, f"subtree {own.parent.relative_to(root)}")
    takeover = _own_cgroup_is_ours(own, rel)
    if takeover is not None:
        _into_leaf(own, takeover)
        kind = "a container's own cgroup" if takeover.container else "own cgroup"
        return Subtree(own, f"{kind} {rel}")
    if _systemd_running():
        scope = _systemd_scope(root, instance)
        _into_leaf(scope)
        return Subtree(scope, f"transient scope {scope.name} (Delegate=yes)")
    return _sibling(root, own, rel, instance)


def _unit_name(instance: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", instance)[:64]
    return f"sandboxd-{safe}-{os.getpid()}.scope"


def _systemd_scope(root: Path, instance: str) -> Path:
    """Ask systemd for a transient scope with ``Delegate=yes`` holding this process."""
    unit = _unit_name(instance)
    argv = [
        "busctl", "call", "--quiet", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager", "StartTransientUnit", "ssa(sv)a(sa(sv))",
        unit, "fail", "4",
        "PIDs", "au", "1", str(os.getpid()),
        "Delegate", "b", "true",
        "CollectMode", "s", "inactive-or-failed",
        "Description", "s", f"sandboxd {instance}: per-call cgroups of pid {os.getpid()}",
        "0",
    ]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=SCOPE_WAIT_S,
                             check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CgroupUnavailable(f"cannot ask systemd for a delegated scope: {exc}") from exc
    if res.returncode != 0:
        raise CgroupUnavailable(
            f"systemd refused a delegated scope ({unit}): {res.stderr.strip() or res.returncode}"
        )
    deadline = time.monotonic() + SCOPE_WAIT_S
    while time.monotonic() < deadline:
        rel = own_path()
        if rel.endswith("/" + unit):
            return root / rel.lstrip("/")
        time.sleep(0.02)
    raise CgroupUnavailable(f"systemd started {unit} but this process did not move into it")


def _sibling(root: Path, own: Path, rel: str, instance: str) -> Subtree:
    """No systemd: a private cgroup beside the own one, removed again at exit."""
    parent = own if rel == "/" else own.parent
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", instance)[:64]
    d = parent / f"sandboxd-{safe}-{os.getpid()}"
    d.mkdir(exist_ok=True)
    try:
        _into_leaf(d)
    except BaseException:
        with contextlib.suppress(OSError):
            _write(own / "cgroup.procs", str(os.getpid()))
        with contextlib.suppress(OSError):
            (d / LEAF).rmdir()
            d.rmdir()
        raise
    atexit.register(_leave_sibling, own, d)
    return Subtree(d, f"private cgroup {d.relative_to(root)} (no systemd)")


def _leave_sibling(own: Path, d: Path) -> None:
    """At exit: move back into the original cgroup and remove the sibling tree."""
    with contextlib.suppress(OSError):
        _write(own / "cgroup.procs", str(os.getpid()))
    for sub in sorted(d.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if sub.is_dir():
            with contextlib.suppress(OSError):
                sub.rmdir()
    with contextlib.suppress(OSError):
        d.rmdir()
