"""The ``workspace`` backend: the file tools (read_file, write_file, list_files), in the daemon.

No code runs, so no process is needed; the danger is the path. The path opened is the one
the policy decided on (``Invocation.path``, the result of :func:`sandboxd.policy.paths.normalise`:
relative, no ``..``, no control or invisible characters, no padding spaces, NFC); it is never
re-derived from the raw argument (a caller without a policy decision has its argument put
through the same function). It is confined by walking it one component at a time with
directory descriptors (``openat`` with ``O_NOFOLLOW``):

* a symlink anywhere on the path is refused (``ELOOP``/``ENOTDIR`` on ``O_NOFOLLOW``), so nothing
  can lead out of the workspace, whatever a sandboxed program planted there;
* only regular files are read (no FIFOs, devices or sockets: ``O_NONBLOCK`` plus ``fstat``);
* writes go to a temporary file that is renamed into place, capped at ``max_file_bytes`` and by
  the session quota, and are owned by the sandbox user when the daemon is root.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
import time

from sandboxd.errors import SandboxdError
from sandboxd.models import (
    Cleanup,
    Invocation,
    Limits,
    ProbeReport,
    Reason,
    Result,
    Status,
    ToolKind,
    Truncated,
    new_id,
)
from sandboxd.policy import paths
from sandboxd.quotafs import quota_message, workspace_usage

MAX_LIST_ENTRIES = 1000


PathRefused = paths.PathRefused  # the path is not allowed (outside the workspace, symlink, ...)


class FileToolError(SandboxdError, ValueError):
    """The operation failed for an ordinary reason (not found, too large, ...)."""

    code = "file-tool-error"


def split_workspace_path(path: str) -> list[str]:
    """The components of a workspace path, or :class:`PathRefused`: the one normalisation
    (idempotent, so the policy's result passes through unchanged)."""
    return paths.components(paths.normalise(path))


def _open_dir(root: str, parts: list[str], *, create: bool = False,
              owner: tuple[int, int] | None = None) -> int:
    """A descriptor of the directory ``root/parts...``, never following a symlink."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o700, dir_fd=fd)
                if owner is not None:
                    os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _explain(exc: OSError, path: str) -> Exception:
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return PathRefused(f"'{path}' is or passes through a symbolic link, which is not allowed")
    if exc.errno == errno.ENOTDIR:
        return PathRefused(f"'{path}': a component of the path is not a directory (or a symlink)")
    if exc.errno == errno.ENOENT:
        return FileToolError(f"'{path}' does not exist in the workspace")
    if exc.errno == errno.EISDIR:
        return FileToolError(f"'{path}' is a directory")
    return FileToolError(f"'{path}': {os.strerror(exc.errno or 0)}")


def read_file(root: str, path: str, max_bytes: int) -> str:
    """The text of a regular file in the workspace."""
    parts = split_workspace_path(path)
    if not parts:
        raise FileToolError("the workspace root is a directory; name a file")
    try:
        dfd = _open_dir(root, parts[:-1])
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        raise _explain(exc, path) from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if stat.S_ISDIR(st.st_mode):
            raise FileToolError(f"'{path}' is a directory; use list_files")
        if not stat.S_ISREG(st.st_mode):
            raise PathRefused(f"'{path}' is not a regular file")
        if st.st_size > max_bytes:
            raise FileToolError(f"'{path}' is {st.st_size} bytes; the limit is {max_bytes} bytes")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileToolError(f"'{path}' is larger than the limit of {max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise FileToolError(f"'{path}' is not UTF-8 text ({len(data)} bytes)") from None


def write_file(root: str, path: str, content: str, max_bytes: int, quota_left: int | None,
               owner: tuple[int, int] | None, full_message: str | None = None) -> int:
    """Create or replace a file atomically; returns the bytes written. ``full_message`` is
    what a write that runs out of room (``ENOSPC``: a tmpfs workspace is full) reports."""
    parts = split_workspace_path(path)
    if not parts:
        raise FileToolError("name a file to write, not the workspace root")
    data = content.encode("utf-8")
    if len(data) > max_bytes:
        raise FileToolError(f"content is {len(data)} bytes; the limit is {max_bytes} bytes")
    if quota_left is not None and data and len(data) > quota_left:  # emptying a file frees
        raise FileToolError(
            f"content is {len(data)} bytes but only {max(quota_left, 0)} bytes of the "
            "workspace quota are left"
        )
    try:
        dfd = _open_dir(root, parts[:-1], create=True, owner=owner)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT) and full_message:
            raise FileToolError(full_message) from None
        raise _explain(exc, path) from None
    tmp = f".sandboxd-{new_id('w')}.tmp"
    try:
        try:
            existing = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(existing.st_mode):
                raise FileToolError(f"'{path}' is a directory")
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                if owner is not None:
                    os.fchown(fh.fileno(), *owner)
            os.rename(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT) and full_message:
            raise FileToolError(full_message) from None
        raise _explain(exc, path) from None
    finally:
        os.close(dfd)
    return len(data)


def list_files(root: str, path: str) -> list[dict[str, object]]:
    """The entries of a workspace directory (name, type, size), sorted by name."""
    parts = split_workspace_path(path)
    try:
        dfd = _open_dir(root, parts)
    except OSError as exc:
        raise _explain(exc, path) from None
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


class WorkspaceBackend:
    """File tools on the session workspace, confined by descriptor-based path walking."""

    name = "workspace"

    def __init__(self, *, quota_bytes: int, quota_entries: int) -> None:
        self.quota_bytes = quota_bytes  # a session workspace's quota (advisory checks)
        self.quota_entries = quota_entries

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def availability(self) -> tuple[bool, str | None]:
        return True, None

    async def close_session(self, session_id: str) -> None:
        return None

    def kernel_sessions(self) -> set[str]:
        return set()

    async def restart_kernel(self, session_id: str) -> bool:
        return False

    async def probe(self) -> ProbeReport:
        return ProbeReport(backend=self.name, ok=True, detail="file tools run in the daemon; "
                           "paths are confined with O_NOFOLLOW descriptor walks")

    async def run(self, invocation: Invocation, limits: Limits, deadline: float) -> Result:
        """Perform one file operation (in a thread: file I/O blocks)."""
        return await asyncio.to_thread(self._run, invocation, limits)

    def _run(self, inv: Invocation, limits: Limits) -> Result:
        started = time.monotonic()
        root = str(inv.workspace)
        args = inv.arguments
        path = inv.path if inv.path is not None else str(args.get("path", "."))
        stdout, value, status, message = "", None, Status.ok, None
        reason, exit_code = Reason.exited, 0
        try:
            if inv.kind is ToolKind.read_file:
                stdout = read_file(root, path, inv.max_file_bytes)
                value = {"path": path, "bytes": len(stdout.encode())}
            elif inv.kind is ToolKind.write_file:
                # measured (bounded; statvfs for a tmpfs workspace), and in any case held by
                # the kernel when the workspace is a tmpfs: ENOSPC then says the same
                usage = workspace_usage(inv.workspace, self.quota_bytes, self.quota_entries)
                full = quota_message(usage)
                if usage.entries >= usage.quota_entries or not usage.exact:
                    raise FileToolError(full)
                quota_left = usage.quota_bytes - usage.bytes
                # what it creates belongs to the sandbox identity of the workspace
                owner = (inv.uid, inv.uid) if inv.uid is not None else None
                written = write_file(root, path, args["content"], inv.max_file_bytes,
                                     quota_left, owner, full)
                value = {"path": path, "bytes": written}
                stdout = f"wrote {written} bytes to {path}"
            elif inv.kind is ToolKind.list_files:
                entries = list_files(root, path)
                value = entries
                stdout = "\n".join(
                    f"{e['name']}{'/' if e['type'] == 'dir' else ''}\t{e['size']}" for e in entries
                )
            else:
                raise FileToolError(f"the workspace backend cannot run '{inv.kind}' tools")
        except PathRefused as exc:
            status, reason, exit_code, message = Status.rejected, Reason.policy, None, str(exc)
        except FileToolError as exc:
            status, exit_code, message = Status.error, 1, str(exc)
        truncated = len(stdout.encode()) > limits.output_bytes
        if truncated:
            stdout = stdout.encode()[: limits.output_bytes].decode("utf-8", "ignore")
        return Result.build(
            inv, self.name, reason, status=status, exit_code=exit_code, limits=limits,
            started=started, cleanup=Cleanup(verified=True, detail="no process was started"),
            stdout=stdout, stderr=message or "", truncated=Truncated(stdout=truncated),
            value=value, message=message,
        )
