"""Kernel-enforced workspace quotas: one size- and inode-limited tmpfs per workspace.

Each workspace (a session's, or the temporary one of a call without a session) is a tmpfs
mounted by the daemon at ``<state>/workspaces/<name>`` with ``size=<quota bytes>``,
``nr_inodes=<quota entries>``, ``mode=0700``, owned by the workspace's own sandbox uid (from the
uid pool, :mod:`sandboxd.host.uids`), ``nosuid,nodev``. The
kernel then holds the quota *during* a call, on every backend: a write past it fails with
``ENOSPC`` whoever does it (a restricted worker chrooted into the mount, a container that has
it bind-mounted at ``/workspace``, the daemon's own file tools). Usage is read with
``statvfs`` (constant time, no walk), and removing a workspace is an unmount (the memory is
freed at once) plus an ``rmdir``.

Mounting needs ``CAP_SYS_ADMIN`` and the ``mount``/``umount2`` system calls. The hardened
systemd unit has neither (a daemon that can mount could unmount the unit's own
``ProtectSystem=``/``ProtectHome=`` views); the drop-in ``sandboxd-quota.conf`` grants them (see
docs/operations.md for the trade-off). Even then the daemon does not keep the right to mount:
at start-up, before it reads any request, it starts a **mount helper** (a small process of its
own, :mod:`sandboxd.workspaces.mount_helper`) and then installs a seccomp filter on itself (every
thread)
that refuses ``mount``, ``umount2`` and the rest of the mount API. From then on only the helper
mounts, and only what it is asked over its private socket pairs (one for the daemon's
threads, one for its event loop: a call's workspace without the CPU of a thread hop): make a
directory directly below the workspaces directory (which it holds open by descriptor since
start-up, so a later symlink cannot redirect it) and mount a tmpfs with the given limits on it
while it is empty; unmount such a directory, and remove it once it is empty. A compromised
daemon can ask for nothing else. Without them (that unit, a non-root
daemon, a container without ``CAP_SYS_ADMIN``) the quota is *advisory*: workspaces are plain
directories measured by :mod:`sandboxd.workspaces.fstree` (bounded, off the event loop) before and
after
each call, a call's per-file limit is lowered to what is left of the quota, and a session over
its quota gets no further code calls. ``workspace_quota`` chooses: ``auto`` (kernel when
possible), ``kernel`` (required: the daemon is not ready without it), ``advisory``.

Memory: tmpfs pages are charged to the memory cgroup of the process that writes them (the
call's cgroup or container), so a single call cannot write more to its workspace than its
memory limit allows either.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import socket
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from sandboxd.util.deadline import within
from sandboxd.workspaces import fstree
from sandboxd.workspaces.mount_helper import FS_SOURCE as FS_SOURCE  # (restarts finds mounts by it)
from sandboxd.workspaces.mount_helper import (  # noqa: F401 - re-exported (one definition of each)
    MAX_MESSAGE,
    MNT_DETACH,
    UMOUNT_NOFOLLOW,
    decode_reply,
    encode_request,
    helper_argv,
    helper_main,  # the helper's entry point before it had a module of its own
    mount_tmpfs,
    unmount,
)

log = logging.getLogger("sandboxd.quota")

PROBE_NAME = ".quota-probe"


def unescape_mountinfo(field: str) -> str:
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
                    point = unescape_mountinfo(fields[4])
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


#: what a write that found the workspace full printed (strerror of ENOSPC and EDQUOT)
_FULL_ERRORS = re.compile("No space left on device|Disk quota exceeded")


def full_note(usage: Usage | None, output_tail: str, quota: Usage) -> str | None:
    """What a call's result tells the model when its workspace is full, or None: a write that
    failed with ENOSPC (or, under an advisory quota, EFBIG at the per-file cap) otherwise
    reads as an obscure OS error. ``usage``: the workspace's after the call (None: not
    measured); ``output_tail``: the end of its output, all there is to go by when the
    workspace is gone with its sandbox (a one-shot container's own tmpfs), against ``quota``."""
    if usage is not None and (usage.full or usage.over):
        return quota_message(usage)
    return quota_message(quota) if _FULL_ERRORS.search(output_tail) else None


def mounted_usage(path: Path, quota_bytes: int, quota_entries: int) -> Usage | None:
    """Usage of a mounted workspace (its own size and inode limits are the quota): one
    ``statvfs`` of a tmpfs, no walk and no disk; None when ``path`` is not a mount point."""
    if not is_mount_point(path):
        return None
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    entries = max(st.f_files - st.f_ffree - 1, 0)  # the root directory uses one inode
    return Usage(used, entries, st.f_blocks * st.f_frsize or quota_bytes,
                 max(st.f_files - 1, 0) or quota_entries)


def workspace_usage(path: Path, quota_bytes: int, quota_entries: int) -> Usage:
    """Usage of a workspace: :func:`mounted_usage` for a mounted one, a bounded
    :func:`fstree.measure` walk otherwise. Blocks: call it in a thread."""
    mounted = mounted_usage(path, quota_bytes, quota_entries)
    if mounted is not None:
        return mounted
    tree = fstree.measure(path, max_entries=quota_entries, deadline_s=MEASURE_DEADLINE_S)
    return Usage(tree.bytes, tree.entries, quota_bytes, quota_entries, exact=tree.complete)


# ----------------------------------------------------------------- the mount helper

HELPER_REPLY_TIMEOUT_S = 30.0


class MountHelper:
    """The daemon's end of the mount helper: two channels, each a request and its reply at a
    time. Threads share one (:meth:`request`, serialised by a lock); the event loop has the
    other (:meth:`arequest`, serialised by an asyncio lock)."""

    def __init__(self, root: Path) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        aio_parent, aio_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            self.proc = subprocess.Popen(
                helper_argv(str(Path(fstree.__file__).resolve().parents[2]),
                            [child.fileno(), aio_child.fileno()], root_fd),
                pass_fds=(child.fileno(), aio_child.fileno(), root_fd),
                stdin=subprocess.DEVNULL, close_fds=True,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            )
        except BaseException:
            parent.close()
            aio_parent.close()
            raise
        finally:
            child.close()
            aio_child.close()
            os.close(root_fd)
        self.sock = parent
        self.sock.settimeout(HELPER_REPLY_TIMEOUT_S)
        self._lock = threading.Lock()
        aio_parent.setblocking(False)
        self.aio_sock: socket.socket | None = aio_parent
        self._alock: asyncio.Lock | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def request(self, **msg: object) -> None:
        with self._lock:
            request = encode_request(msg)
            try:
                self.sock.send(request)
                raw = self.sock.recv(MAX_MESSAGE)
            except OSError as exc:
                raise OSError(errno.EPIPE, f"the mount helper is gone ({exc})") from None
        _raise_for(raw)

    async def arequest(self, **msg: object) -> None:
        """:meth:`request` from the event loop. The exchange runs to its end even when the
        caller is cancelled (the channel's next reply is then still the next request's); a
        helper that does not answer in time closes the channel for good (OSError: the
        caller then takes the threads' channel)."""
        raw = encode_request(msg)
        if self._alock is None:
            self._alock = asyncio.Lock()
        exchange = asyncio.ensure_future(self._exchange(self._alock, raw))
        _raise_for(await asyncio.shield(exchange))

    async def _exchange(self, lock: asyncio.Lock, raw: bytes) -> bytes:
        async with lock:
            sock = self.aio_sock
            if sock is None:
                raise OSError(errno.EPIPE, "the mount helper's event-loop channel is closed")
            loop = asyncio.get_running_loop()
            try:
                await loop.sock_sendall(sock, raw)
                answered, reply = await within(loop.sock_recv(sock, MAX_MESSAGE),
                                               HELPER_REPLY_TIMEOUT_S)
            except OSError as exc:
                self._close_aio()
                raise OSError(errno.EPIPE, f"the mount helper is gone ({exc})") from None
            if not answered:
                self._close_aio()
                raise OSError(errno.ETIMEDOUT, "the mount helper did not answer")
            return reply

    def _close_aio(self) -> None:
        sock, self.aio_sock = self.aio_sock, None
        if sock is not None:
            sock.close()

    def close(self) -> None:
        self._close_aio()
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(Exception):
            self.proc.wait(5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def _raise_for(raw: bytes) -> None:
    """A helper's reply: nothing for success, else its OSError (EPIPE: no reply at all)."""
    if not raw:
        raise OSError(errno.EPIPE, "the mount helper is gone")
    err, message = decode_reply(raw)
    if err:
        raise OSError(err, message)


#: the mount API, refused to the daemon itself once its helper runs
MOUNT_SYSCALLS = ("mount", "umount", "umount2", "fsopen", "fsconfig", "fsmount", "fspick",
                  "move_mount", "open_tree", "mount_setattr", "pivot_root")


def forbid_mounts_to_this_process() -> str | None:
    """Install a seccomp filter on every thread of this process (and its future children) that
    refuses the mount API with EPERM. None when done, else why not."""
    try:
        import pyseccomp
    except ImportError as exc:
        return f"pyseccomp is missing ({exc})"
    try:
        filt = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
        filt.set_attr(pyseccomp.Attr.CTL_TSYNC, 1)
        for name in MOUNT_SYSCALLS:
            with contextlib.suppress(ValueError, RuntimeError, OSError):
                filt.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
        filt.load()
    except (OSError, ValueError, RuntimeError) as exc:
        return str(exc)
    return None


# ----------------------------------------------------------------- workspaces


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
        self.helper: MountHelper | None = None

    # ------------------------------------------------------------ start-up

    def detect(self, *, helper: bool = False) -> None:
        """Decide the mode: try to mount (and unmount) a tiny tmpfs below ``root``. With
        ``helper`` (the daemon, at start-up, before it reads any request) and kernel quotas
        available: start the mount helper and forbid mounts to this process from then on."""
        if self.setting == "advisory":
            self.kernel, self.detail = False, "advisory (workspace_quota=advisory)"
            return
        self._probe_mount()
        if self.kernel and helper and self.helper is None:
            self._start_helper()
        if not self.kernel:
            if self.setting == "kernel":
                log.error("workspace_quota=kernel but %s", self.detail)
            else:
                log.warning("workspace quota is %s", self.detail)

    def _probe_mount(self) -> None:
        """Set the mode by whether this process can mount (and unmount) a tiny tmpfs below
        ``root``, and say why in :attr:`detail`."""
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

    def _start_helper(self) -> None:
        """Start the mount helper and forbid mounts to this process from then on; advisory
        quotas when the helper cannot start."""
        try:
            self.helper = MountHelper(self.root)
        except OSError as exc:
            self.kernel = False
            self.detail = f"advisory: the mount helper could not start ({exc})"
        else:
            refused = forbid_mounts_to_this_process()
            self.detail += (", mounted by a helper process (the daemon itself cannot "
                            "mount)" if refused is None else
                            f", mounted by a helper process (the daemon could not forbid "
                            f"itself to mount: {refused})")

    @property
    def ok(self) -> bool:
        """False when kernel quotas are required and not available, or their helper died."""
        if self.helper is not None and not self.helper.alive():
            return False
        return self.kernel or self.setting != "kernel"

    def close(self) -> None:
        """Stop the mount helper (after every workspace is unmounted)."""
        if self.helper is not None:
            self.helper.close()
            self.helper = None

    @property
    def inodes(self) -> int:
        """A workspace tmpfs's inode limit: one more than the entry quota (the root directory
        uses one)."""
        return self.quota_entries + 1

    def _limits(self, uid: int | None) -> dict[str, int | None]:
        """A workspace tmpfs's limits as the mount helper takes them."""
        return {"size": self.quota_bytes, "inodes": self.inodes, "uid": uid}

    def _unmount(self, path: Path) -> None:
        if self.helper is not None and path.parent == self.root:
            self.helper.request(op="umount", name=path.name)
        else:
            unmount(path)

    # ------------------------------------------------------------ workspaces

    def create(self, name: str, uid: int | None) -> Path:
        """A new, empty workspace ``root/name`` owned by the sandbox identity ``uid`` (= gid;
        None: the daemon's own, when it is not root). Blocks: call it in a thread, or
        :meth:`create_soon` on the event loop."""
        path = self.root / name
        if self.kernel and self.helper is not None:
            self.helper.request(op="create", name=name, **self._limits(uid))
            return path
        owner = (uid, uid) if uid is not None else None
        path.mkdir(mode=0o700)
        try:
            if self.kernel:
                mount_tmpfs(path, size_bytes=self.quota_bytes, inodes=self.inodes, owner=owner)
            elif owner is not None:
                os.chown(path, *owner)
        except BaseException:
            with contextlib.suppress(OSError):
                path.rmdir()
            raise
        return path

    def _loop_channel(self) -> MountHelper | None:
        """The mount helper when its event-loop channel serves this daemon's workspaces."""
        helper = self.helper
        usable = self.kernel and helper is not None and helper.aio_sock is not None
        return helper if usable else None

    def create_soon(self, name: str, uid: int | None) -> asyncio.Future[Path]:
        """:meth:`create` from the event loop: one exchange with the mount helper's event-loop
        channel when there is one (no thread), else in a worker thread. Either way it runs to
        its end even when its awaiter is cancelled."""
        helper = self._loop_channel()
        if helper is not None:
            async def by_helper() -> Path:
                await helper.arequest(op="create", name=name, **self._limits(uid))
                return self.root / name

            return asyncio.ensure_future(by_helper())
        return asyncio.get_running_loop().run_in_executor(None, self.create, name, uid)

    def usage(self, path: Path) -> Usage:
        """See :func:`workspace_usage`. Blocks: call it in a thread."""
        return workspace_usage(path, self.quota_bytes, self.quota_entries)

    def remove(self, path: Path) -> None:
        """Unmount (if mounted) and remove a workspace. Blocks: call it in a thread, or
        :meth:`remove_soon` on the event loop. Raises OSError when something stays behind."""
        if is_mount_point(path):
            self._unmount(path)
        fstree.remove_tree(path)

    async def remove_soon(self, path: Path) -> None:
        """:meth:`remove` from the event loop: one exchange with the mount helper's event-loop
        channel (unmount, then remove the directory it leaves empty); when that fails (the
        directory is no mount point and holds files, the channel closed), :meth:`remove` in a
        worker thread."""
        helper = self._loop_channel()
        if helper is not None and path.parent == self.root:
            try:
                await helper.arequest(op="remove", name=path.name)
                return
            except OSError as exc:
                log.debug("the mount helper did not remove %s (%s): removing it here",
                          path, exc)
        await asyncio.to_thread(self.remove, path)
