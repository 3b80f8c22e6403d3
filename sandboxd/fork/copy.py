"""Copy a session's workspace into a fork's, as sandboxed code left it: hostile.

Like :mod:`sandboxd.workspaces.fstree`, the copy works on directory descriptors only
(``openat`` with ``O_NOFOLLOW`` at every step: a symlink the sandbox planted, or a directory
swapped for one while the copy runs, is never followed), never crosses into another
filesystem, and is bounded: ``max_bytes`` and ``max_entries`` (the fork's quota), and
:data:`MAX_DEPTH` levels (each level holds two descriptors open). It copies what the parent's
sandbox could have made itself: directories, regular files and symlinks (as links) owned by
the parent's uid; anything else (a fifo, a socket, a file another uid owns) is left out and
counted. Every entry made is given to the fork's uid, without set-id bits. Blocking: callers
use ``asyncio.to_thread``.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from sandboxd.errors import SandboxdError

#: directory levels a workspace may nest to be forked
MAX_DEPTH = 64
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


class ForkRefused(SandboxdError):
    """The workspace cannot be copied (over the fork's quota, nested too deep)."""

    code = "fork-over-quota"


@dataclass
class Copied:
    """What a copy made: ``bytes`` and ``entries`` copied, ``skipped`` entries left out."""

    bytes: int = 0
    entries: int = 0
    skipped: int = 0


def _copy_chunk(src: int, dst: int, size: int) -> int:
    """Up to ``size`` bytes from ``src`` to ``dst``: in the kernel where it can (two tmpfs
    mounts are two filesystems: ``copy_file_range`` may refuse them), else read and write."""
    try:
        return os.copy_file_range(src, dst, size)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    data = os.read(src, size)
    view = memoryview(data)
    while view:
        view = view[os.write(dst, view):]
    return len(data)


class _Copy:
    def __init__(self, owner: int | None, uid: int | None, max_bytes: int,
                 max_entries: int) -> None:
        self.owner = owner
        self.uid = uid
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.done = Copied()
        self.device = -1

    def _own(self, st: os.stat_result) -> bool:
        return self.owner is None or st.st_uid == self.owner

    def _give(self, fd: int, mode: int) -> None:
        if self.uid is not None:
            os.fchown(fd, self.uid, self.uid)
        os.fchmod(fd, stat.S_IMODE(mode) & 0o1777)

    def _count(self, size: int = 0) -> None:
        self.done.entries += 1
        self.done.bytes += size
        if self.done.entries > self.max_entries:
            raise ForkRefused(f"the workspace holds more than {self.max_entries} files and "
                              "directories, the fork's quota (session_quota_entries)")
        if self.done.bytes > self.max_bytes:
            raise ForkRefused(f"the workspace holds more than {self.max_bytes} bytes, the "
                              "fork's quota (session_quota_bytes)")

    def file(self, src_dir: int, dst_dir: int, name: str) -> None:
        try:
            src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                          dir_fd=src_dir)
        except OSError:  # gone, or swapped for a symlink or a fifo meanwhile
            self.done.skipped += 1
            return
        try:
            st = os.fstat(src)
            if not stat.S_ISREG(st.st_mode) or not self._own(st):
                self.done.skipped += 1
                return
            self._count(st.st_size)
            dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, 0o600, dir_fd=dst_dir)
            try:
                self._pour(src, dst, st.st_size)
                self._give(dst, st.st_mode)
            finally:
                os.close(dst)
        finally:
            os.close(src)

    def _pour(self, src: int, dst: int, size: int) -> None:
        """Copy ``src``, ``size`` bytes at its stat, into ``dst``: a file growing meanwhile is
        read to at most one byte past that size, the excess counted against the quota."""
        copied = 0
        while copied <= size:
            n = _copy_chunk(src, dst, min(_CHUNK, size - copied + 1))
            if n == 0:
                break
            copied += n
        if copied > size:
            self._count(copied - size)

    def tree(self, src_root: int, dst_root: int) -> None:
        self.device = os.fstat(src_root).st_dev
        stack: list[tuple[int, int, list[os.DirEntry[str]]]] = []

        def enter(src: int, dst: int) -> None:
            if len(stack) >= MAX_DEPTH:
                raise ForkRefused(f"the workspace nests directories deeper than {MAX_DEPTH} "
                                  "levels: it cannot be forked")
            with os.scandir(src) as entries:
                stack.append((src, dst, list(entries)))

        top = (os.dup(src_root), os.dup(dst_root))
        try:
            enter(*top)
        except BaseException:
            os.close(top[0])
            os.close(top[1])
            raise
        try:
            while stack:
                src, dst, entries = stack[-1]
                if not entries:
                    stack.pop()
                    os.close(src)
                    os.close(dst)
                    continue
                self._entry(src, dst, entries.pop(), enter)
        finally:
            for src, dst, _ in stack:
                os.close(src)
                os.close(dst)

    def _entry(self, src: int, dst: int, entry: os.DirEntry[str],
               enter: Callable[[int, int], None]) -> None:
        """Copy one entry of the directory ``src`` into ``dst`` by its kind: a regular file,
        a symlink and a directory on the same filesystem owned by the parent's uid; anything
        else (or an entry gone meanwhile) is counted as skipped."""
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            self.done.skipped += 1
            return
        if stat.S_ISREG(st.st_mode):
            self.file(src, dst, entry.name)
        elif stat.S_ISLNK(st.st_mode) and self._own(st):
            self._link(src, dst, entry.name)
        elif stat.S_ISDIR(st.st_mode) and self._own(st) and st.st_dev == self.device:
            self._subdir(src, dst, entry.name, enter)
        else:
            self.done.skipped += 1

    def _link(self, src: int, dst: int, name: str) -> None:
        """Copy the symlink ``name`` as a link (never followed), given to the fork's uid."""
        self._count()
        os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
        if self.uid is not None:
            os.chown(name, self.uid, self.uid, dir_fd=dst, follow_symlinks=False)

    def _subdir(self, src: int, dst: int, name: str,
                enter: Callable[[int, int], None]) -> None:
        try:
            child = os.open(name, _DIR, dir_fd=src)
        except OSError:
            self.done.skipped += 1
            return
        try:
            st = os.fstat(child)
            if st.st_dev != self.device or not self._own(st):
                self.done.skipped += 1
                os.close(child)
                return
            self._count()
            os.mkdir(name, 0o700, dir_fd=dst)
            made = os.open(name, _DIR, dir_fd=dst)
        except BaseException:
            os.close(child)
            raise
        try:
            self._give(made, st.st_mode | stat.S_IRWXU)
            enter(child, made)
        except BaseException:
            os.close(child)
            os.close(made)
            raise


def copy_workspace(src: str, dst: str, *, owner: int | None, uid: int | None,
                   max_bytes: int, max_entries: int) -> Copied:
    """Copy the tree below ``src`` (entries owned by ``owner``; None: any) into the empty
    directory ``dst``, each entry given to ``uid`` (None: left to the daemon)."""
    src_fd = os.open(src, _DIR)
    try:
        dst_fd = os.open(dst, _DIR)
        try:
            job = _Copy(owner, uid, max_bytes, max_entries)
            job.tree(src_fd, dst_fd)
            return job.done
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)
