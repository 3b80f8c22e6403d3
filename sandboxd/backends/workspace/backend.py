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
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from sandboxd.backends.base import Backend
from sandboxd.backends.workspace.files import (
    AtomicFile,
    check_upload,
    decode_content,
    list_files,
    read_bytes,
    read_file,
    write_file,
)
from sandboxd.backends.workspace_errors import (
    FileMissing,
    FileToolError,
    IsADirectory,
    NotADirectory,
    NotPermitted,
    OverQuota,
    PathRefused,
    RefusedPath,
    TooLarge,
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
)
from sandboxd.workspaces.quota import quota_message, workspace_usage
from sandboxd.workspaces.transfer import FILES_ROUTE, Transfer, UploadAborted

if TYPE_CHECKING:
    from sandboxd.config import Settings
    from sandboxd.host.uids import UidPool

__all__ = ["FileMissing", "FileToolError", "IsADirectory", "NotADirectory", "NotPermitted",
           "OverQuota", "PathRefused", "RefusedPath", "TooLarge", "WorkspaceBackend"]

#: what one file operation gave: its text, its value, a raw download's bytes
class Done(NamedTuple):
    stdout: str
    value: Any
    body: bytes | None


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
        try:
            done = self._operation(inv)(inv, limits)
        except (PathRefused, FileToolError) as exc:
            return self._result(inv, limits, started, "", None, exc)
        result = self._result(inv, limits, started, done.stdout, done.value, None)
        result.body = done.body
        return result

    def _operation(self, inv: Invocation) -> Callable[[Invocation, Limits], Done]:
        """The file operation a call asks for (a read: as a download's bytes, as base64 or
        as text)."""
        kind = inv.plan.kind
        if kind is ToolKind.read_file and inv.transfer is not None:
            return _download
        if kind is ToolKind.read_file:
            return _read_base64 if _encoding(inv) == "base64" else _read_text
        if kind is ToolKind.write_file:
            return self._write
        if kind is ToolKind.list_files:
            return _list
        raise FileToolError(f"the workspace backend cannot run '{kind}' tools")

    def _write(self, inv: Invocation, limits: Limits) -> Done:
        quota_left, owner, full = self._budget(inv)
        path = _path_of(inv)
        content = decode_content(str(inv.arguments["content"]), _encoding(inv))
        written = write_file(str(inv.workspace), path, content, inv.plan.max_file_bytes,
                             quota_left, owner, full)
        return Done(f"wrote {written} bytes to {path}", {"path": path, "bytes": written}, None)

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


def _encoding(inv: Invocation) -> str:
    return str(inv.arguments.get("encoding", "utf-8"))


def _download(inv: Invocation, limits: Limits) -> Done:
    """A raw download: the bytes, for the endpoint to send."""
    path = _path_of(inv)
    body = read_bytes(str(inv.workspace), path, inv.plan.max_file_bytes)
    return Done(f"sent {len(body)} bytes of {path}", {"path": path, "bytes": len(body)}, body)


def _read_base64(inv: Invocation, limits: Limits) -> Done:
    """A read as base64, whole or refused (cut base64 would be corrupt data)."""
    path = _path_of(inv)
    data = read_bytes(str(inv.workspace), path, inv.plan.max_file_bytes)
    encoded = base64.b64encode(data).decode("ascii")
    if len(encoded) > limits.output_bytes:
        raise FileToolError(
            f"'{path}' is {len(data)} bytes, {len(encoded)} in base64, over the "
            f"output limit of {limits.output_bytes} bytes; download the raw "
            "bytes with GET " + FILES_ROUTE.format(session=inv.session or "{session}",
                                                   path=path))
    return Done(encoded, {"path": path, "bytes": len(data), "encoding": "base64"}, None)


def _read_text(inv: Invocation, limits: Limits) -> Done:
    path = _path_of(inv)
    text = read_file(str(inv.workspace), path, inv.plan.max_file_bytes, inv.session)
    return Done(text, {"path": path, "bytes": len(text.encode())}, None)


def _list(inv: Invocation, limits: Limits) -> Done:
    entries = list_files(str(inv.workspace), _path_of(inv))
    lines = (f"{e['name']}{'/' if e['type'] == 'dir' else ''}\t{e['size']}" for e in entries)
    return Done("\n".join(lines), entries, None)


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
