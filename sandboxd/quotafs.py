"""Kernel-enforced workspace quotas: one size- and inode-limited tmpfs per workspace.

Each workspace (a session's, or the temporary one of a call without a session) is a tmpfs
mounted by the daemon at ``<state>/workspaces/<name>`` with ``size=<quota bytes>``,
``nr_inodes=<quota entries>``, ``mode=0700``, owned by the workspace's own sandbox uid (from the
uid pool, :mod:`sandboxd.uids`), ``nosuid,nodev``. The
kernel then holds the quota *during* a call, on every backend: a write past it fails with
``ENOSPC`` whoever does it (a restricted worker chrooted into the mount, a container that has
it bind-mounted at ``/workspace``, the daemon's own file tools). Usage is read with
``statvfs`` (constant time, no walk), and removing a workspace is an unmount (the memory is
freed at once) plus an ``rmdir``.

Mounting needs ``CAP_SYS_ADMIN`` and the ``mount``/``umount2`` system calls. The hardened
systemd unit has neither (giving them to the daemon would let a compromised daemon unmount the
unit's own ``ProtectSystem=``/``ProtectHome=`` views); the drop-in ``sandboxd-quota.conf``
grants them (see docs/operations.md for the trade-off). Without them (that unit, a non-root
daemon, a container without ``CAP_SYS_ADMIN``) the quota is *advisory*: workspaces are plain
directories measured by :mod:`sandboxd.fstree` (bounded, off the event loop) before and after
each call, a call's per-file limit is lowered to what is left of the quota, and a session over
its quota gets no further code calls. ``workspace_quota`` chooses: ``auto`` (kernel when
possible), ``kernel`` (required: the daemon is not ready without it), ``advisory``.

Memory: tmpfs pages are charged to the memory cgroup of the process that writes them (the
call's cgroup or container), so a single call cannot write more to its workspace than its
memory limit allows either.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from sandboxd import fstree

log = logging.getLogger("sandboxd.quota")

MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOATIME = 0x400
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8
FS_SOURCE = b"sandboxd-workspace"
PROBE_NAME = ".quota-probe"

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                ctypes.c_ulong, ctypes.c_char_p]
        _libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return _libc


def mount_tmpfs(path: Path, *, size_bytes: int, inodes: int,
                owner: tuple[int, int] | None) -> None:
    """Mount a size- and inode-limited tmpfs on the (empty, daemon-made) directory ``path``."""
    opts = f"size={int(size_bytes)},nr_inodes={int(inodes)},mode=0700"
    if owner is not None:
        opts += f",uid={int(owner[0])},gid={int(owner[1])}"
    rc = _lib().mount(FS_SOURCE, os.fsencode(path), b"tmpfs",
                      MS_NOSUID | MS_NODEV | MS_NOATIME, opts.encode())
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {path}: {os.strerror(err)}")


def unmount(path: Path) -> None:
    """Unmount ``path``; lazily (``MNT_DETACH``) when a process still uses it (a worker of a
    crashed daemon, say): it leaves the mount table at once and is freed with its last user."""
    lib = _lib()
    target = os.fsencode(path)
    if lib.umount2(target, UMOUNT_NOFOLLOW) == 0:
        return
    err = ctypes.get_errno()
    if err == errno.EBUSY and lib.umount2(target, UMOUNT_NOFOLLOW | MNT_DETACH) == 0:
        return
    err = ctypes.get_errno() or err
    raise OSError(err, f"unmount {path}: {os.strerror(err)}")


def _unescape(field: str) -> str:
    """Undo mountinfo's octal escapes (``\\040`` for a space...)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts_below(root: Path) -> list[Path]:
    """Mount points strictly below ``root`` in this process's mount namespace (deepest first)."""
    prefix = str(root).rstrip("/") + "/"
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 4:
                    point = _unescape(fields[4])
                    if point.startswith(prefix):
                        found.append(Path(point))
    except OSError:
        return []
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def is_mount_point(path: Path) -> bool:
    try:
        return os.path.ismount(path)
    except OSError:
        return False


@dataclass
class Usage:
    """A workspace's usage and limits. ``exact`` is False when a walk was cut short (then the
    workspace is at least this full: over the entry limit, or too slow to measure)."""

    bytes: int
    entries: int
    quota_bytes: int
    quota_entries: int
    exact: bool = True

    @property
    def over(self) -> bool:
        return (self.bytes > self.quota_bytes or self.entries > self.quota_entries
                or not self.exact)

    @property
    def full(self) -> bool:
        """No room left for another block or inode (a write failed, or will)."""
        return (self.bytes >= self.quota_bytes - FULL_SLACK
                or self.entries >= self.quota_entries or not self.exact)


#: a tmpfs is "full" when fewer bytes than this are free (allocation is per page)
FULL_SLACK = 64 * 1024
#: longest a quota walk of an advisory (unmounted) workspace may take (in a worker thread: it
#: delays only its own session's call; the entry quota bounds it first in practice)
MEASURE_DEADLINE_S = 30.0


def quota_message(usage: Usage) -> str:
    """What a model is told when its workspace is full."""
    mib = usage.quota_bytes / (1024 * 1024)
    size = f"{mib:g} MiB" if mib >= 1 else f"{usage.quota_bytes} bytes"
    if usage.entries >= usage.quota_entries:
        return (f"the workspace limit of {usage.quota_entries} files and directories is "
                "reached; delete files you no longer need, or start a new session")
    used = f" ({usage.bytes} bytes used)" if usage.bytes else ""
    return (f"the workspace quota of {size} is full{used}; delete files you no longer need, "
            "or start a new session")


def workspace_usage(path: Path, quota_bytes: int, quota_entries: int) -> Usage:
    """Usage of a workspace: ``statvfs`` for a mounted one (its own size and inode limits are
    the quota), a bounded :func:`fstree.measure` walk otherwise. Blocks: call it in a thread."""
    if is_mount_point(path):
        st = os.statvfs(path)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        entries = max(st.f_files - st.f_ffree - 1, 0)  # the root directory uses one inode
        return Usage(used, entries, st.f_blocks * st.f_frsize or quota_bytes,
                     max(st.f_files - 1, 0) or quota_entries)
    tree = fstree.measure(path, max_entries=quota_entries, deadline_s=MEASURE_DEADLINE_S)
    return Usage(tree.bytes, tree.entries, quota_bytes, quota_entries, exact=tree.complete)


class WorkspaceFS:
    """Creates, measures and removes workspaces below ``root``: tmpfs mounts in ``kernel``
    mode, plain directories in ``advisory`` mode (see the module docstring)."""

    def __init__(self, root: Path, *, quota_bytes: int, quota_entries: int,
                 setting: str) -> None:
        self.root = root
        self.quota_bytes = quota_bytes
        self.quota_entries = quota_entries
        self.setting = setting  # "auto" | "kernel" | "advisory"
        self.kernel = False
        self.detail = "not checked yet"

    # ------------------------------------------------------------ start-up

    def detect(self) -> None:
        """Decide the mode: try to mount (and unmount) a tiny tmpfs below ``root``."""
        if self.setting == "advisory":
            self.kernel, self.detail = False, "advisory (workspace_quota=advisory)"
            return
        probe = self.root / f"{PROBE_NAME}-{os.getpid()}"
        try:
            if is_mount_point(probe):
                unmount(probe)
            fstree.remove_tree(probe)
            probe.mkdir(mode=0o700)
            mount_tmpfs(probe, size_bytes=64 * 1024, inodes=16, owner=None)
            unmount(probe)
        except OSError as exc:
            self.kernel = False
            why = exc.strerror or str(exc)
            self.detail = (
                f"advisory: this daemon cannot mount a tmpfs per workspace ({why}; it needs "
                "CAP_SYS_ADMIN and the mount system calls: run it as root, or install the "
                "systemd drop-in sandboxd-quota.conf); the quota is checked before and after "
                "each call only"
            )
        else:
            self.kernel = True
            self.detail = (f"kernel: a tmpfs per workspace (size={self.quota_bytes}, "
                           f"nr_inodes={self.quota_entries})")
        finally:
            with contextlib.suppress(OSError):
                fstree.remove_tree(probe)
        if self.setting == "kernel" and not self.kernel:
            log.error("workspace_quota=kernel but %s", self.detail)
        elif not self.kernel:
            log.warning("workspace quota is %s", self.detail)

    @property
    def ok(self) -> bool:
        """False only when kernel quotas are required and not available."""
        return self.kernel or self.setting != "kernel"

    # ------------------------------------------------------------ workspaces

    def create(self, name: str, uid: int | None) -> Path:
        """A new, empty workspace ``root/name`` owned by the sandbox identity ``uid`` (= gid;
        None: the daemon's own, when it is not root)."""
        owner = (uid, uid) if uid is not None else None
        path = self.root / name
        path.mkdir(mode=0o700)
        try:
            if self.kernel:
                # one inode more than the entry quota: the root directory uses one
                mount_tmpfs(path, size_bytes=self.quota_bytes, inodes=self.quota_entries + 1,
                            owner=owner)
            elif owner is not None:
                os.chown(path, *owner)
        except BaseException:
            with contextlib.suppress(OSError):
                path.rmdir()
            raise
        return path

    def usage(self, path: Path) -> Usage:
        """See :func:`workspace_usage`. Blocks: call it in a thread."""
        return workspace_usage(path, self.quota_bytes, self.quota_entries)

    def remove(self, path: Path) -> None:
        """Unmount (if mounted) and remove a workspace. Blocks: call it in a thread. Raises
        OSError when something stays behind."""
        if is_mount_point(path):
            unmount(path)
        fstree.remove_tree(path)

    def sweep_mounts(self) -> list[Path]:
        """Unmount every mount below ``root`` (start-up and shutdown): returns them."""
        done = []
        for point in mounts_below(self.root):
            try:
                unmount(point)
                done.append(point)
            except OSError as exc:
                log.error("could not unmount %s: %s", point, exc)
        return done
