"""The file operations of the workspace backend, each confined by walking its path one
component at a time with directory descriptors (``openat`` with ``O_NOFOLLOW``): a symlink
anywhere on the path is refused, only regular files are read, writes go to a temporary file
renamed into place (see :mod:`.backend` for why)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import os
import stat
from collections.abc import Iterator

from sandboxd.backends.workspace_errors import (
    LIST_HINT,
    FileToolError,
    IsADirectory,
    OverQuota,
    PathRefused,
    TooLarge,
    explain,
    not_a_directory,
)
from sandboxd.models import new_id
from sandboxd.protocol import rules
from sandboxd.workspaces.transfer import binary_hint

MAX_LIST_ENTRIES = 1000


def split_workspace_path(path: str) -> list[str]:
    """The components of a workspace path, or :class:`PathRefused`: the one normalisation
    (idempotent, so the policy's result passes through unchanged)."""
    return rules.path_components(rules.normalise_path(path))


def open_dir(root: str, parts: list[str], *, create: bool = False,
              owner: tuple[int, int] | None = None, target: list[str] | None = None) -> int:
    """A descriptor of the directory ``root/parts...``, never following a symlink; a name on
    the way that is a symlink is :class:`PathRefused`, one that is a file :class:`NotADirectory`
    (``target``: the whole path asked for, when ``parts`` leads to its directory)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            try:
                nxt = _open_child(fd, part, create, owner)
            except NotADirectoryError:
                raise not_a_directory(fd, target or parts, i) from None
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_child(fd: int, part: str, create: bool, owner: tuple[int, int] | None) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(part, flags, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
    os.mkdir(part, 0o700, dir_fd=fd)
    if owner is not None:
        os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
    return os.open(part, flags, dir_fd=fd)


def read_bytes(root: str, path: str, max_bytes: int) -> bytes:
    """The content of a regular file in the workspace (at most ``max_bytes``)."""
    parts = split_workspace_path(path)
    if not parts:
        raise IsADirectory(f"the workspace root is a directory; name a file ({LIST_HINT})")
    try:
        dfd = open_dir(root, parts[:-1], target=parts)
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        raise explain(exc, path) from None
    mode = os.fstat(fd).st_mode  # before fdopen, which refuses a directory with EISDIR
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise IsADirectory(f"'{path}' is a directory; {LIST_HINT}")
        raise PathRefused(f"'{path}' is not a regular file")
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if st.st_size > max_bytes:
            raise FileToolError(f"'{path}' is {st.st_size} bytes; the limit is {max_bytes} bytes")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileToolError(f"'{path}' is larger than the limit of {max_bytes} bytes")
    return data


def read_file(root: str, path: str, max_bytes: int, session: str | None = None) -> str:
    """The text of a regular file in the workspace; a file that is not UTF-8 text is refused
    with a message that says how to fetch it instead."""
    data = read_bytes(root, path, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise FileToolError(f"'{path}' is not UTF-8 text ({len(data)} bytes); "
                            + binary_hint(path, session)) from None


def decode_content(content: str, encoding: str) -> bytes:
    """The bytes a write_file ``content`` stands for (``utf-8`` text or ``base64``)."""
    if encoding != "base64":
        return content.encode("utf-8")
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise FileToolError("content is not valid base64 (RFC 4648, standard alphabet, "
                            "padded; no line breaks)") from None


def write_file(root: str, path: str, content: str | bytes, max_bytes: int,
               quota_left: int | None, owner: tuple[int, int] | None,
               full_message: str | None = None) -> int:
    """Create or replace a file atomically; returns the bytes written. ``full_message`` is
    what a write that runs out of room (``ENOSPC``: a tmpfs workspace is full) reports."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    if len(data) > max_bytes:
        raise FileToolError(f"content is {len(data)} bytes; the limit is {max_bytes} bytes")
    if quota_left is not None and data and len(data) > quota_left:  # emptying a file frees
        raise FileToolError(_over_quota(len(data), quota_left))

    target = AtomicFile(root, path, owner, full_message)
    try:
        target.write(data)
    except BaseException:
        target.abort()
        raise
    target.commit()
    return len(data)


def _over_quota(size: int, quota_left: int) -> str:
    return (f"content is {size} bytes but only {max(quota_left, 0)} bytes of the "
            "workspace quota are left")


def check_upload(total: int, max_bytes: int, quota_left: int | None, *,
                 declared: bool = False) -> None:
    """An upload of ``total`` bytes (so far, or as its ``Content-Length`` declared) over
    ``max_bytes`` (:class:`TooLarge`) or over the quota left (:class:`OverQuota`)."""
    if total > max_bytes:
        size = f"is {total} bytes" if declared else f"is more than {max_bytes} bytes"
        raise TooLarge(f"the upload {size}; files may be at most {max_bytes} bytes here")
    if quota_left is not None and total > quota_left:
        size = f"is {total} bytes" if declared else f"is more than {max(quota_left, 0)} bytes"
        raise OverQuota(f"the upload {size} but only {max(quota_left, 0)} bytes of the "
                        "workspace quota are left")


class AtomicFile:
    """A new file written to a temporary file in the target's directory (the path walked
    without following symlinks) and renamed into place by :meth:`commit`; :meth:`abort`
    (on any failure) removes it. ``full_message`` is what running out of room
    (``ENOSPC``: a tmpfs workspace is full) reports."""

    def __init__(self, root: str, path: str, owner: tuple[int, int] | None,
                 full_message: str | None = None) -> None:
        parts = split_workspace_path(path)
        if not parts:
            raise IsADirectory("the workspace root is a directory; name a file to write")
        self.path, self.owner, self.full = path, owner, full_message
        self.name, self.tmp, self.fd = parts[-1], f".sandboxd-{new_id('w')}.tmp", -1
        with self._errors():
            self.dfd = open_dir(root, parts[:-1], create=True, owner=owner, target=parts)
        try:
            with self._errors():
                with contextlib.suppress(FileNotFoundError):
                    existing = os.stat(self.name, dir_fd=self.dfd, follow_symlinks=False)
                    if stat.S_ISDIR(existing.st_mode):
                        raise IsADirectory(f"'{path}' is a directory, which a file cannot "
                                           f"replace; {LIST_HINT}")
                self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                  | os.O_CLOEXEC, 0o600, dir_fd=self.dfd)
        except BaseException:
            os.close(self.dfd)
            raise

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT) and self.full:
                raise OverQuota(self.full) from None
            raise explain(exc, self.path) from None

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        with self._errors():
            while view:
                view = view[os.write(self.fd, view):]

    def commit(self) -> None:
        """Give the file its owner and rename it into place (removed if that fails)."""
        try:
            with self._errors():
                if self.owner is not None:
                    os.fchown(self.fd, *self.owner)
                fd, self.fd = self.fd, -1
                os.close(fd)
                os.rename(self.tmp, self.name, src_dir_fd=self.dfd, dst_dir_fd=self.dfd)
        except BaseException:
            self.abort()
            raise
        os.close(self.dfd)
        self.dfd = -1

    def abort(self) -> None:
        """Remove the temporary file (nothing changes); again is harmless."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)
        if self.dfd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp, dir_fd=self.dfd)
            dfd, self.dfd = self.dfd, -1
            os.close(dfd)


def list_files(root: str, path: str) -> list[dict[str, object]]:
    """The entries of a workspace directory (name, type, size), sorted by name."""
    parts = split_workspace_path(path)
    try:
        dfd = open_dir(root, parts)
    except OSError as exc:
        raise explain(exc, path) from None
    try:
        entries = []
        with os.scandir(dfd) as it:
            for entry in it:
                if entry.name.startswith(".sandboxd-"):
                    continue
                st = entry.stat(follow_symlinks=False)
                kind = ("dir" if stat.S_ISDIR(st.st_mode) else
                        "file" if stat.S_ISREG(st.st_mode) else
                        "symlink" if stat.S_ISLNK(st.st_mode) else "other")
                entries.append({"name": entry.name, "type": kind, "size": st.st_size})
                if len(entries) >= MAX_LIST_ENTRIES:
                    break
    finally:
        os.close(dfd)
    return sorted(entries, key=lambda e: str(e["name"]))
