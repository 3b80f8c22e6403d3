"""Measure, re-own and remove directory trees that sandboxed code wrote: the one place that
does it.

Workspaces (and probe directories) are written by code we do not trust, so a tree may be deep
(thousands of levels), wide (hundreds of thousands of empty files), full of symlinks, or change
while it is read. Every function here therefore:

* works on directory descriptors (``openat``/``unlinkat``/``fstatat`` relative to a descriptor,
  ``O_NOFOLLOW``): no path is resolved through a symlink the sandbox planted, and neither the
  depth nor the length of a path matters;
* is iterative (an explicit stack, never recursion): a deep tree cannot raise
  ``RecursionError``;
* keeps at most :data:`FD_WINDOW` descriptors open, whatever the depth: a level that fell out of
  the window is re-opened with ``openat(child, "..")`` and checked against the device and inode
  recorded on the way down (a tree that changed under the walk stops it, with an error);
* never crosses into another filesystem (a mount point inside the tree is left alone);
* is bounded where it can be: :func:`measure` stops after ``max_entries`` entries or at its
  deadline and says so (``complete=False``). :func:`remove_tree` must remove everything, so it
  is bounded only by the tree; callers run it in a worker thread, never on the event loop.

Nothing here blocks on an event loop: callers use ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sandboxd.errors import SandboxdError

#: descriptors one walk keeps open at most (levels deeper than this are re-opened via "..")
FD_WINDOW = 32
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TreeError(SandboxdError, OSError):
    """The tree could not be walked or removed completely (it changed, or an entry resisted)."""

    code = "tree-error"


@dataclass
class TreeUsage:
    """What :func:`measure` found: bytes allocated, entries (inodes) below the root, and whether
    the walk saw everything (False: it stopped at its entry limit or deadline)."""

    bytes: int = 0
    entries: int = 0
    complete: bool = True


@dataclass
class _Level:
    name: str  # name in the parent directory
    dev: int
    ino: int
    fd: int | None
    pending: list[str] | None = None  # _Walk: subdirectories still to visit
    failed: set[str] = field(default_factory=set)  # remove: entries that resisted


class _Stack:
    """The directories from the root down to the current one, at most FD_WINDOW of them open."""

    def __init__(self, root_fd: int) -> None:
        st = os.fstat(root_fd)
        self.levels = [_Level("", st.st_dev, st.st_ino, root_fd)]
        self.dev = st.st_dev
        self.open = 1

    @property
    def top(self) -> _Level:
        return self.levels[-1]

    def fd(self) -> int:
        fd = self.top.fd
        assert fd is not None
        return fd

    def push(self, name: str) -> bool:
        """Descend into the subdirectory ``name`` of the top level. False when it is not a
        directory on the same filesystem (it is then left alone)."""
        fd = self._open_subdir(name)
        if fd is None:
            return False
        st = os.fstat(fd)
        if st.st_dev != self.dev:  # a mount point: never walk into another filesystem
            os.close(fd)
            return False
        self.levels.append(_Level(name, st.st_dev, st.st_ino, fd))
        self.open += 1
        if self.open > FD_WINDOW:
            self._close_shallowest()
        return True

    def _open_subdir(self, name: str) -> int | None:
        """A descriptor of the subdirectory ``name`` of the top level (made walkable again
        when the sandbox made it unreadable); None when it is no directory (any more)."""
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=self.fd())
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP, errno.ENOENT):
                return None
            if exc.errno != errno.EACCES or not _grant_access(self.fd(), name):
                raise
        return os.open(name, _DIR_FLAGS, dir_fd=self.fd())

    def _close_shallowest(self) -> None:
        """Close the shallowest open level but the root (:meth:`pop` re-opens it)."""
        for level in self.levels[1:]:
            if level.fd is not None:
                os.close(level.fd)
                level.fd = None
                self.open -= 1
                return

    def pop(self) -> _Level:
        """Leave the top level for its parent (re-opened through ".." and checked if it had
        fallen out of the window); returns the level left, its descriptor closed."""
        child = self.levels.pop()
        parent = self.levels[-1]
        try:
            if parent.fd is None:
                fd = os.open("..", _DIR_FLAGS, dir_fd=child.fd)
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != (parent.dev, parent.ino):
                    os.close(fd)
                    raise TreeError(errno.ESTALE, "the tree changed while it was walked")
                parent.fd = fd
                self.open += 1
        finally:
            if child.fd is not None:
                os.close(child.fd)
                child.fd = None
                self.open -= 1
        return child

    def close(self) -> None:
        for level in self.levels[1:]:  # the root descriptor belongs to the caller
            if level.fd is not None:
                with contextlib.suppress(OSError):
                    os.close(level.fd)
                level.fd = None


def _grant_access(dir_fd: int, name: str) -> bool:
    """Make ``name`` (a directory the sandbox made unreadable, e.g. mode 000) walkable again.
    Only needed when the daemon is not root (root has DAC_OVERRIDE); never follows a symlink:
    the directory is pinned with ``O_PATH|O_NOFOLLOW`` and changed through its descriptor."""
    try:
        pfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC,
                      dir_fd=dir_fd)
    except OSError:
        return False
    try:
        os.chmod(f"/proc/self/fd/{pfd}", 0o700)
        return True
    except OSError:
        return False
    finally:
        os.close(pfd)


def _open_root(path: Path) -> int:
    return os.open(path, _DIR_FLAGS)


class _Walk:
    """Every entry below the directory ``root_fd``, pre-order (a directory's entries, then each
    of its subdirectories in turn), each with the descriptor of the directory holding it: the
    one walk of :func:`measure` and :func:`chown_tree`. ``strict``: a subdirectory that cannot
    be entered, or a tree that changed under the walk, raises; otherwise that part is left out
    and :attr:`complete` turns False. Stopping the iteration early closes what it opened."""

    def __init__(self, root_fd: int, *, strict: bool) -> None:
        self.root_fd = root_fd
        self.strict = strict
        self.complete = True

    def __iter__(self) -> Iterator[tuple[int, os.DirEntry[str]]]:
        stack = _Stack(self.root_fd)
        try:
            while True:
                top = stack.top
                if top.pending is None:
                    yield from _scan(stack, top)
                if top.pending:
                    self._descend(stack, top.pending.pop())
                elif len(stack.levels) == 1 or not self._ascend(stack):
                    return
        finally:
            stack.close()

    def _descend(self, stack: _Stack, name: str) -> None:
        try:
            stack.push(name)
        except OSError:
            if self.strict:
                raise
            self.complete = False  # unreadable: what is below it is left out

    def _ascend(self, stack: _Stack) -> bool:
        """Back to the parent; False when the tree changed under the walk (not strict)."""
        try:
            stack.pop()
        except TreeError:
            if self.strict:
                raise
            self.complete = False
            return False
        return True


def _scan(stack: _Stack, top: _Level) -> Iterator[tuple[int, os.DirEntry[str]]]:
    """The entries of the top level's directory; its subdirectories become its pending."""
    top.pending = []
    with os.scandir(stack.fd()) as it:
        for entry in it:
            yield stack.fd(), entry
            if _is_dir(entry):
                top.pending.append(entry.name)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def measure(path: Path, *, max_entries: int, deadline_s: float | None = None) -> TreeUsage:
    """Bytes allocated and entries below ``path`` (not counting ``path`` itself), never
    following symlinks or crossing mount points. Stops, with ``complete=False``, once more than
    ``max_entries`` entries were seen or after ``deadline_s`` seconds: a caller enforcing a
    limit of ``max_entries`` then knows the tree is over it. Empty files count as entries (an
    inode each) even though they use no bytes. A missing ``path`` measures as empty."""
    usage = TreeUsage()
    try:
        root = _open_root(path)
    except FileNotFoundError:
        return usage
    stop_at = time.monotonic() + deadline_s if deadline_s is not None else math.inf
    walk = _Walk(root, strict=False)
    try:
        for _, entry in walk:
            usage.entries += 1
            if usage.entries > max_entries or (
                    usage.entries % 256 == 0 and time.monotonic() > stop_at):
                usage.complete = False
                return usage
            usage.bytes += _allocated(entry)
        usage.complete = walk.complete  # (all seen: complete, even at the deadline)
        return usage
    finally:
        os.close(root)


def _allocated(entry: os.DirEntry[str]) -> int:
    """The bytes an entry takes (its blocks; its size when the filesystem reports none)."""
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return 0
    return st.st_blocks * 512 if st.st_blocks else st.st_size


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """Give ``path`` and every entry below it to ``uid:gid`` (symlinks themselves, never what
    they point to; never crossing a mount point). Raises OSError when the walk fails."""
    root = _open_root(path)
    try:
        os.fchown(root, uid, gid)
        for dir_fd, entry in _Walk(root, strict=True):
            os.chown(entry.name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
    finally:
        os.close(root)


class _Emptying:
    """The walk of :func:`empty_dir`: the directories it holds open, and what stays."""

    def __init__(self, dir_fd: int) -> None:
        self.stack = _Stack(dir_fd)
        self.failures: list[str] = []

    def _stays(self, name: str, why: object) -> None:
        """``name`` (in the current directory) could not be removed: skip it from now on."""
        self.stack.top.failed.add(name)
        self.failures.append(f"{name}: {why}")

    def sweep(self) -> tuple[str | None, bool]:
        """Unlink the current directory's entries that are not directories, up to the first
        subdirectory (or entry replaced by one meanwhile); that subdirectory's name to enter
        (None: there was none), and whether anything was removed."""
        top, progress = self.stack.top, False
        with os.scandir(self.stack.fd()) as it:
            for entry in it:
                if entry.name in top.failed:
                    continue
                if _is_dir(entry):
                    return entry.name, progress
                try:
                    os.unlink(entry.name, dir_fd=self.stack.fd())
                    progress = True
                except FileNotFoundError:
                    progress = True
                except IsADirectoryError:  # replaced by a directory meanwhile
                    return entry.name, progress
                except OSError as exc:
                    self._stays(entry.name, exc.strerror)
        return None, progress

    def enter(self, name: str) -> None:
        """Descend into the subdirectory ``name``; a symlink or file that replaced it is
        removed as a file; a mount point (another filesystem) is left alone, and reported."""
        try:
            if self.stack.push(name):
                return
        except OSError as exc:
            self.failures.append(f"{name}: {exc.strerror}")
        try:
            os.unlink(name, dir_fd=self.stack.fd())
        except FileNotFoundError:
            pass
        except OSError:
            self._stays(name, "another filesystem or not removable")

    def leave(self) -> None:
        """Back up to the parent, removing the directory just emptied."""
        child = self.stack.pop()
        try:
            os.rmdir(child.name, dir_fd=self.stack.fd())
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._stays(child.name, exc.strerror)


def empty_dir(dir_fd: int) -> None:
    """Remove everything below the directory ``dir_fd`` (the directory itself stays).
    Raises :class:`TreeError` when something could not be removed."""
    walk = _Emptying(dir_fd)
    try:
        while True:
            descend, progress = walk.sweep()
            if descend is not None:
                walk.enter(descend)
            elif progress:
                continue  # entries removed while listing: list again until nothing is left
            elif len(walk.stack.levels) == 1:
                break
            else:
                walk.leave()
    finally:
        walk.stack.close()
    if walk.failures:
        raise TreeError(errno.ENOTEMPTY, f"{len(walk.failures)} entries could not be "
                        f"removed, e.g. {walk.failures[0]}")


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything below it (a file or symlink at ``path`` is unlinked).
    A missing ``path`` is not an error; anything left behind raises :class:`TreeError`."""
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            st = os.stat(path.name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path.name, dir_fd=parent)
            return
        try:
            fd = os.open(path.name, _DIR_FLAGS, dir_fd=parent)
        except PermissionError:
            if not _grant_access(parent, path.name):
                raise
            fd = os.open(path.name, _DIR_FLAGS, dir_fd=parent)
        try:
            empty_dir(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(path.name, dir_fd=parent)
    finally:
        os.close(parent)


def remove_tree_quietly(path: Path) -> bool:
    """:func:`remove_tree`, returning False (instead of raising) when something was left."""
    try:
        remove_tree(path)
    except OSError:
        return False
    return True
