"""The errors of the file tools (:mod:`sandboxd.backends.workspace`), and what a client can act
on for each OS error of a workspace path.

Each error has a ``code``, a row of the one problem table (:mod:`sandboxd.api.problems`) for the
raw file endpoints; the JSON tools and MCP answer its message in an error result. A client's
mistake is never a 500: a directory where a file is meant, a name on the path that is a file,
refused permissions each have their own error, worded with the workspace-relative path (never
the OS's text nor a host path). An OS error no client can cause (``EIO``, ``EMFILE``...) is
raised as it is: the service logs it and answers a 500 without internals.
"""

from __future__ import annotations

import errno
import os
import stat

from sandboxd.errors import SandboxdError
from sandboxd.protocol import rules

PathRefused = rules.PathRefused  # the path is not allowed (outside the workspace, symlink, ...)
#: what an error about a directory suggests instead
LIST_HINT = "list its files with the list_files tool"


class FileToolError(SandboxdError, ValueError):
    """The operation failed for an ordinary reason (not found, too large, ...)."""

    code = "file-tool-error"


class RefusedPath(FileToolError):
    """A transfer's path refused by the confinement (``..``, a symlink, not a regular file):
    the file endpoints' 403, which a path the policy's file rules deny gets too."""

    code = "path-refused"


class FileMissing(FileToolError):
    """The file (or a directory on its path) does not exist."""

    code = "file-missing"


class IsADirectory(FileToolError):
    """The path names a directory where a file is meant (read, download, replace)."""

    code = "is-a-directory"


class NotADirectory(FileToolError):
    """A name on the path (or the directory to list) is a file, not a directory."""

    code = "not-a-directory"


class NotPermitted(FileToolError):
    """The file's permissions refuse the daemon (a sandboxed program changed them)."""

    code = "file-not-permitted"


class TooLarge(FileToolError):
    """An upload went over the file size cap (the endpoint answers 413)."""

    code = "file-too-large"


class OverQuota(FileToolError):
    """An upload went over the session workspace quota."""

    code = "file-over-quota"


def not_a_directory(fd: int, parts: list[str], i: int) -> Exception:
    """Why ``parts[i]`` (in the directory ``fd``) could not be opened as a directory: a
    symlink (refused), or a file or special file on the way (:class:`NotADirectory`)."""
    where = "/".join(parts[: i + 1])
    try:
        mode = os.stat(parts[i], dir_fd=fd, follow_symlinks=False).st_mode
    except FileNotFoundError:  # removed in the meantime
        return FileMissing(f"'{where}' does not exist in the workspace")
    if stat.S_ISLNK(mode):
        return PathRefused(f"'{where}' is a symbolic link, which is not allowed")
    what = "a file" if stat.S_ISREG(mode) else "a special file (a FIFO, socket or device)"
    if i == len(parts) - 1:
        hint = "; read it with read_file" if stat.S_ISREG(mode) else ""
        return NotADirectory(f"'{where}' is {what}, not a directory{hint}")
    return NotADirectory(f"'{where}' is {what}, not a directory, so '{'/'.join(parts)}' "
                         "cannot exist")


def explain(exc: OSError, path: str) -> Exception:
    """The error a client can act on for an OS error of ``path``, or ``exc`` itself when no
    client can cause it."""
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return PathRefused(f"'{path}' is or passes through a symbolic link, which is not allowed")
    if exc.errno == errno.ENOTDIR:
        return NotADirectory(f"'{path}': a name on the path is a file, not a directory")
    if exc.errno == errno.ENOENT:
        return FileMissing(f"'{path}' does not exist in the workspace")
    if exc.errno in (errno.EISDIR, errno.ENOTEMPTY):
        return IsADirectory(f"'{path}' is a directory; {LIST_HINT}")
    if exc.errno == errno.EEXIST:  # a sandboxed program made it at the same moment
        return FileToolError(f"'{path}' changed while it was being written; try again")
    if exc.errno == errno.ENAMETOOLONG:  # rules.normalise_path refuses these already
        return PathRefused("a name in the path is longer than the filesystem allows")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return NotPermitted(f"'{path}': its permissions do not allow this (a program in the "
                            "sandbox may have changed them)")
    if exc.errno == errno.EFBIG:
        return TooLarge(f"'{path}': the file would be larger than the filesystem allows")
    return exc
