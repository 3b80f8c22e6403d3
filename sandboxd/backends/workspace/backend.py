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

Binary content: ``encoding: "base64"`` on read_file/write_file, or the raw file endpoints
(``PUT``/``GET /v1/sessions/{id}/files/{path}``, :mod:`sandboxd.workspaces.transfer`), which come
here as
the same tools with an :class:`~sandboxd.workspaces.transfer.Transfer` attached: an upload is
streamed
into the temporary file in bounded chunks, a download returns the bytes to the endpoint in the
result's ``body`` (with a failure's problem code in its ``problem``; neither is serialised).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from sandboxd.backends.base import Backend
from sandboxd.backends.workspace_errors import (
    LIST_HINT,
    FileMissing,
    FileToolError,
    IsADirectory,
    NotADirectory,
    NotPermitted,
    OverQuota,
    PathRefused,
    RefusedPath,
    TooLarge,
    explain,
    not_a_directory,
)
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
from sandboxd.protocol import rules
from sandboxd.workspaces.quota import quota_message, workspace_usage
from sandboxd.workspaces.transfer import FILES_ROUTE, Transfer, UploadAborted, binary_hint

if TYPE_CHECKING:
    from sandboxd.config import Settings
    from sandboxd.host.uids import UidPool

MAX_LIST_ENTRIES = 1000


__all__ = ["FileMissing", "FileToolError", "IsADirectory", "NotADirectory", "NotPermitted",
           "OverQuota", "PathRefused", "RefusedPath", "TooLarge", "WorkspaceBackend"]


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


class WorkspaceBackend(Backend):
    """File tools on the session workspace, confined by descriptor-based path walking."""

    name = "workspace"

    def __init__(self, *, quota_bytes: int, quota_entries: int) -> None:
        self.quota_bytes = quota_bytes  # a session workspace's quota (advisory checks)
        self.quota_entries = quota_entries

    @classmethod
    def from_settings(cls, settings: Settings, uids: UidPool | None = None) -> WorkspaceBackend:
        """The backend as the daemon builds it from its settings (it needs no uids)."""
        return cls(quota_bytes=settings.session_quota_bytes,
                   quota_entries=settings.session_quota_entries)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def availability(self) -> tuple[bool, str | None]:
        return True, None

    async def close_session(self, session_id: str) -> None:
        return None

    async def probe(self) -> ProbeReport:
        return ProbeReport(backend=self.name, ok=True, detail="file tools run in the daemon; "
                           "paths are confined with O_NOFOLLOW descriptor walks")

    async def run(self, invocation: Invocation, deadline: float) -> Result:
        """Perform one file operation (in a thread: file I/O blocks; an upload's body is
        received on the event loop)."""
        limits = invocation.plan.limits
        transfer = invocation.transfer
        if transfer is not None and invocation.plan.kind is ToolKind.write_file:
            return await self._upload(invocation, limits, transfer, deadline)
        return await asyncio.to_thread(self._run, invocation, limits)

    def _budget(self, inv: Invocation) -> tuple[int, tuple[int, int] | None, str]:
        """What a write may still take of the quota, who will own it, and what a full
        workspace says; :class:`OverQuota` when no file fits at all."""
        # measured (bounded; statvfs for a tmpfs workspace), and in any case held by the
        # kernel when the workspace is a tmpfs: ENOSPC then says the same
        usage = workspace_usage(inv.workspace, self.quota_bytes, self.quota_entries)
        full = quota_message(usage)
        if usage.entries >= usage.quota_entries or not usage.exact:
            raise OverQuota(full)
        # what it creates belongs to the sandbox identity of the workspace
        owner = (inv.uid, inv.uid) if inv.uid is not None else None
        return usage.quota_bytes - usage.bytes, owner, full

    async def _upload(self, inv: Invocation, limits: Limits, transfer: Transfer,
                      deadline: float) -> Result:
        """A raw upload: the body received on the event loop (no thread waits on the
        network, within the minimum rate and the deadline), each piece written to the
        temporary file by a short thread hop, renamed into place at its end."""
        started = time.monotonic()
        path = _path_of(inv)
        try:
            quota_left, owner, full = await _in_thread(self._budget, inv)
            if transfer.declared is not None:
                check_upload(transfer.declared, inv.plan.max_file_bytes, quota_left, declared=True)
            target = await _in_thread(AtomicFile, str(inv.workspace), path, owner, full,
                                      orphan=AtomicFile.abort)
            try:
                async for chunk in transfer.chunks(deadline):
                    check_upload(transfer.received, inv.plan.max_file_bytes, quota_left)
                    await _in_thread(target.write, chunk)
                await _in_thread(target.commit)
            except BaseException:
                target.abort()
                raise
        except (PathRefused, FileToolError, UploadAborted) as exc:
            return self._result(inv, limits, started, "", None, exc)
        value = {"path": path, "bytes": transfer.received}
        return self._result(inv, limits, started, f"wrote {transfer.received} bytes to {path}",
                            value, None)

    def _run(self, inv: Invocation, limits: Limits) -> Result:
        started = time.monotonic()
        root = str(inv.workspace)
        args = inv.arguments
        path = _path_of(inv)
        value: dict[str, object] | list[dict[str, object]] | None = None
        stdout = ""
        body: bytes | None = None  # a raw download's bytes, for the endpoint to send
        encoding = str(args.get("encoding", "utf-8"))
        try:
            if inv.plan.kind is ToolKind.read_file and inv.transfer is not None:
                body = read_bytes(root, path, inv.plan.max_file_bytes)
                value = {"path": path, "bytes": len(body)}
                stdout = f"sent {len(body)} bytes of {path}"
            elif inv.plan.kind is ToolKind.read_file and encoding == "base64":
                data = read_bytes(root, path, inv.plan.max_file_bytes)
                encoded = base64.b64encode(data).decode("ascii")
                if len(encoded) > limits.output_bytes:  # cut base64 would be corrupt data
                    raise FileToolError(
                        f"'{path}' is {len(data)} bytes, {len(encoded)} in base64, over the "
                        f"output limit of {limits.output_bytes} bytes; download the raw "
                        "bytes with GET " + FILES_ROUTE.format(
                            session=inv.session or "{session}", path=path))
                stdout = encoded
                value = {"path": path, "bytes": len(data), "encoding": "base64"}
            elif inv.plan.kind is ToolKind.read_file:
                stdout = read_file(root, path, inv.plan.max_file_bytes, inv.session)
                value = {"path": path, "bytes": len(stdout.encode())}
            elif inv.plan.kind is ToolKind.write_file:
                quota_left, owner, full = self._budget(inv)
                content = decode_content(str(args["content"]), encoding)
                written = write_file(root, path, content, inv.plan.max_file_bytes,
                                     quota_left, owner, full)
                value = {"path": path, "bytes": written}
                stdout = f"wrote {written} bytes to {path}"
            elif inv.plan.kind is ToolKind.list_files:
                entries = list_files(root, path)
                value = entries
                stdout = "\n".join(
                    f"{e['name']}{'/' if e['type'] == 'dir' else ''}\t{e['size']}" for e in entries
                )
            else:
                raise FileToolError(f"the workspace backend cannot run '{inv.plan.kind}' tools")
        except (PathRefused, FileToolError) as exc:
            return self._result(inv, limits, started, "", None, exc)
        result = self._result(inv, limits, started, stdout, value, None)
        result.body = body
        return result

    def _result(self, inv: Invocation, limits: Limits, started: float, stdout: str,
                value: dict[str, object] | list[dict[str, object]] | None,
                problem: PathRefused | FileToolError | UploadAborted | None) -> Result:
        """The result of a file operation: ``ok``, or the ``problem`` that stopped it (a
        refused path is ``rejected``, any other ``error``), its problem-table code kept."""
        exit_code: int | None = 0
        status, reason, message = Status.ok, Reason.exited, None
        code: str | None = None
        if isinstance(problem, PathRefused):
            status, reason, exit_code, message = Status.rejected, Reason.policy, None, str(problem)
            code = RefusedPath.code
        elif problem is not None:
            status, exit_code, message, code = Status.error, 1, str(problem), problem.code
        truncated = len(stdout.encode()) > limits.output_bytes
        if truncated:
            stdout = stdout.encode()[: limits.output_bytes].decode("utf-8", "ignore")
        return Result.build(
            inv, self.name, reason, status=status, exit_code=exit_code, limits=limits,
            started=started, cleanup=Cleanup(verified=True, detail="no process was started"),
            stdout=stdout, stderr=message or "", truncated=Truncated(stdout=truncated),
            value=value, message=message, problem=code,
        )


def _path_of(inv: Invocation) -> str:
    """The path the policy decided on (the raw argument only without a decision)."""
    return inv.plan.path if inv.plan.path is not None else str(inv.arguments.get("path", "."))


T = TypeVar("T")


async def _in_thread(fn: Callable[..., T], *args: Any,
                     orphan: Callable[[T], None] | None = None) -> T:
    """``fn(*args)`` in a thread (one short file step). Cancelled meanwhile, it waits for the
    thread to finish (a descriptor is never closed under a running write) and hands a result
    that came all the same to ``orphan``."""
    future = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            try:
                await asyncio.wait({future})
            except asyncio.CancelledError:  # again: the first cancellation goes on below
                continue
        if orphan is not None and not future.cancelled() and future.exception() is None:
            orphan(future.result())
        raise
