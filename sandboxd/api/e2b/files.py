"""envd's files: ``GET/POST /files`` (the SDKs' ``files.read``/``files.write``) and the
filesystem service (Connect, JSON): ``Stat`` (``exists``, ``get_info``), ``ListDir`` (to a
bounded depth), ``MakeDir``, ``Move`` (``rename``), ``Remove``. Each is a call of the
service's own file tools (``read_file``, ``write_file``, ``list_files``: their path rules)
or, for what they do not do, of the ``shell`` tool (``mkdir -p``, ``mv``, ``rm -r``: its
command rules), so the policy decides every one and the audit log records it. Paths are
E2B's: the workspace is ``/home/user`` (:func:`~sandboxd.api.e2b.sandboxes.workspace_path`).
The SDK's ``files.watch_dir`` polls watchers (:mod:`sandboxd.api.e2b.watch`); the
streaming ``WatchDir`` is not served.
"""

from __future__ import annotations

import asyncio
import base64
import posixpath
import shlex
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from sandboxd.api.e2b import connect, watch
from sandboxd.api.e2b.access import e2b_client, sandbox_id
from sandboxd.api.e2b.results import refusal
from sandboxd.api.e2b.sandboxes import HOME, TRANSPORT, E2bSandbox, Sandboxes, workspace_path
from sandboxd.backends.workspace.files import MAX_LIST_ENTRIES
from sandboxd.backends.workspace_errors import FileToolError, PathRefused
from sandboxd.models import InvokeRequest, Result, Status

router = APIRouter(include_in_schema=False)
SERVICE = "/filesystem.Filesystem/"
MAX_LIST_DEPTH = 4
"""``files.list(depth=...)``: the deepest listing served (each level one tool call a directory)."""
_TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY", "symlink": "FILE_TYPE_SYMLINK"}


async def _record(request: Request) -> tuple[str, E2bSandbox]:
    client = await e2b_client(request)
    sandboxes: Sandboxes = request.app.state.e2b
    return client, sandboxes.get(client, sandbox_id(request))


async def _call(request: Request, client: str, record: E2bSandbox, tool: str,
                arguments: dict[str, Any]) -> Result:
    """One tool call of the sandbox's session; a refusal or failure as a Connect error."""
    result: Result = await request.app.state.service.invoke(
        client, tool, InvokeRequest(arguments=arguments, session=record.id), transport=TRANSPORT)
    if result.status is not Status.ok:
        raise _failure(result)
    return result


def _failure(result: Result) -> connect.ConnectError:
    """The Connect error of a call that did not end ``ok``: refused by the policy, or failed
    (``not_found`` when the path does not exist)."""
    if result.status in (Status.denied, Status.rejected):
        return connect.ConnectError("permission_denied", refusal(result))
    text = result.message or result.stderr or result.status.value
    code = "not_found" if ("does not exist" in text or "No such file" in text) else (
        "failed_precondition")
    return connect.ConnectError(code, text.strip())


def _arg(path: str) -> str:
    """A workspace path as one argument of a command (never read as an option)."""
    return shlex.quote(path if not path.startswith("-") else "./" + path)


def _entry(parent: str, item: dict[str, Any]) -> dict[str, Any]:
    rel = posixpath.normpath(posixpath.join(parent, str(item["name"])))
    return {"name": item["name"], "type": _TYPES.get(str(item["type"]), "FILE_TYPE_UNSPECIFIED"),
            "path": HOME if rel == "." else f"{HOME}/{rel}", "size": int(item.get("size") or 0)}


async def _list(request: Request, client: str, record: E2bSandbox, path: str,
                depth: int) -> list[dict[str, Any]]:
    """``ListDir`` to ``depth`` levels: one ``list_files`` call a directory (each decided and
    audited), breadth first, never into a symlink (``list_files`` reports one as such and
    walks none), at most :data:`MAX_LIST_DEPTH` levels and :data:`MAX_LIST_ENTRIES` entries
    in all, so that one request cannot walk a whole tree."""
    if depth > MAX_LIST_DEPTH:
        raise connect.ConnectError(
            "invalid_argument", f"depth {depth} is over sandboxd's bound of {MAX_LIST_DEPTH}")
    entries: list[dict[str, Any]] = []
    level = [workspace_path(path)]
    for _ in range(depth):
        below: list[str] = []
        for where in level:
            below += await _list_one(request, client, record, where, entries)
        level = below
    return entries


async def _list_one(request: Request, client: str, record: E2bSandbox, where: str,
                    entries: list[dict[str, Any]]) -> list[str]:
    """List the directory ``where`` into ``entries`` (at most :data:`MAX_LIST_ENTRIES` in
    all); the paths of its subdirectories."""
    listed = await _call(request, client, record, "list_files", {"path": where})
    below: list[str] = []
    for item in listed.value or []:
        entry = _entry(where, item)
        entries.append(entry)
        if len(entries) > MAX_LIST_ENTRIES:
            raise connect.ConnectError(
                "resource_exhausted", f"more than {MAX_LIST_ENTRIES} entries: list a"
                " deeper directory or with a smaller depth")
        if entry["type"] == "FILE_TYPE_DIRECTORY":
            below.append(posixpath.normpath(posixpath.join(where, str(item["name"]))))
    return below


async def _stat(request: Request, client: str, record: E2bSandbox, path: str) -> dict[str, Any]:
    where = posixpath.normpath(workspace_path(path))
    if where == ".":
        return {"name": "user", "type": "FILE_TYPE_DIRECTORY", "path": HOME}
    parent, name = posixpath.split(where)
    listed = await _call(request, client, record, "list_files", {"path": parent or "."})
    for item in listed.value or []:
        if item.get("name") == name:
            return _entry(parent or ".", item)
    raise connect.ConnectError("not_found", f"'{path}' does not exist")


@router.get("/files")
async def read(request: Request) -> Response:
    try:
        client, record = await _record(request)
        path = workspace_path(request.query_params.get("path", ""))
        result = await _call(request, client, record, "read_file",
                             {"path": path, "encoding": "base64"})
    except Exception as exc:
        return connect.unary_error(exc)
    return Response(base64.b64decode(result.stdout), media_type="application/octet-stream")


@router.post("/files")
async def write(request: Request) -> Response:
    try:
        client, record = await _record(request)
        form = await request.form()
        written = []
        for _, part in form.multi_items():
            if isinstance(part, str):
                continue
            path = request.query_params.get("path") or part.filename or ""
            where = workspace_path(path)
            data = await part.read()
            await _call(request, client, record, "write_file",
                        {"path": where, "content": base64.b64encode(data).decode(),
                         "encoding": "base64"})
            written.append({"name": posixpath.basename(where), "type": "file",
                            "path": f"{HOME}/{posixpath.normpath(where)}"})
    except Exception as exc:
        return connect.unary_error(exc)
    return JSONResponse(written)


@router.post(SERVICE + "{method}")
async def filesystem(method: str, request: Request) -> Response:
    try:
        client, record = await _record(request)
        message = await connect.unary_request(request)
        return JSONResponse(await _serve(method, request, client, record, message))
    except Exception as exc:
        return connect.unary_error(exc)


#: one Filesystem method: (request, client, sandbox, message) -> its answer
Method = Callable[[Request, str, E2bSandbox, dict[str, Any]], Awaitable[dict[str, Any]]]


async def _serve(method: str, request: Request, client: str, record: E2bSandbox,
                 message: dict[str, Any]) -> dict[str, Any]:
    """One Filesystem method's answer (a method sandboxd does not serve is refused)."""
    handler = METHODS.get(method)
    if handler is None:
        raise connect.refuse(f"filesystem.{method}")
    return await handler(request, client, record, message)


def _path(message: dict[str, Any], key: str = "path") -> str:
    """A path field of a message ("" when absent)."""
    return str(message.get(key) or "")


async def _stat_method(request: Request, client: str, record: E2bSandbox,
                       message: dict[str, Any]) -> dict[str, Any]:
    return {"entry": await _stat(request, client, record, _path(message))}


async def _list_dir(request: Request, client: str, record: E2bSandbox,
                    message: dict[str, Any]) -> dict[str, Any]:
    return {"entries": await _list(request, client, record, _path(message),
                                   int(message.get("depth") or 1))}


async def _make_dir(request: Request, client: str, record: E2bSandbox,
                    message: dict[str, Any]) -> dict[str, Any]:
    """``MakeDir``: refused when the path exists (E2B's answer), else made with parents."""
    path = _path(message)
    try:
        await _stat(request, client, record, path)
    except connect.ConnectError as exc:
        if exc.code != "not_found":
            raise
    else:
        raise connect.ConnectError("already_exists", f"'{path}' already exists")
    await _call(request, client, record, "shell",
                {"command": f"mkdir -p {_arg(workspace_path(path))}"})
    return {"entry": await _stat(request, client, record, path)}


async def _move(request: Request, client: str, record: E2bSandbox,
                message: dict[str, Any]) -> dict[str, Any]:
    source, target = _path(message, "source"), _path(message, "destination")
    await _call(request, client, record, "shell", {
        "command": f"mv {_arg(workspace_path(source))} {_arg(workspace_path(target))}"})
    return {"entry": await _stat(request, client, record, target)}


async def _remove(request: Request, client: str, record: E2bSandbox,
                  message: dict[str, Any]) -> dict[str, Any]:
    """``Remove``: anything in the workspace, never the workspace itself."""
    where = workspace_path(_path(message))
    if posixpath.normpath(where) == ".":
        raise connect.ConnectError("permission_denied", "the workspace itself stays")
    await _call(request, client, record, "shell", {"command": f"rm -r {_arg(where)}"})
    return {}


async def _create_watcher(request: Request, client: str, record: E2bSandbox,
                          message: dict[str, Any]) -> dict[str, Any]:
    """A new watcher (:mod:`sandboxd.api.e2b.watch`): a ``list_files`` call of the directory
    first, so the policy decides it and the audit log records it."""
    if len(record.watchers) >= watch.MAX_WATCHERS:
        raise connect.ConnectError("resource_exhausted", f"sandbox '{record.id}' holds "
                                   f"{watch.MAX_WATCHERS} watchers, sandboxd's bound: "
                                   "stop one first")
    where = workspace_path(_path(message))
    await _call(request, client, record, "list_files", {"path": where})
    recursive = bool(message.get("recursive"))
    seen = await _snapshot(request, client, record, where, recursive)
    watcher = watch.new_watcher(where, recursive, seen)
    record.watchers[watcher.id] = watcher
    return {"watcherId": watcher.id}


def _watcher_id(record: E2bSandbox, message: dict[str, Any]) -> str:
    """The id of one of the sandbox's watchers that the message names (not_found if none)."""
    watcher_id = str(message.get("watcherId") or "")
    if watcher_id not in record.watchers:
        raise connect.ConnectError("not_found", f"watcher '{watcher_id}' does not exist")
    return watcher_id


async def _watcher_events(request: Request, client: str, record: E2bSandbox,
                          message: dict[str, Any]) -> dict[str, Any]:
    """What changed under a watcher since it last looked."""
    watcher = record.watchers[_watcher_id(record, message)]
    seen = await _snapshot(request, client, record, watcher.path, watcher.recursive)
    events, watcher.seen = watch.changes(watcher.seen, seen), seen
    return {"events": events}


async def _remove_watcher(request: Request, client: str, record: E2bSandbox,
                          message: dict[str, Any]) -> dict[str, Any]:
    del record.watchers[_watcher_id(record, message)]
    return {}


#: the Filesystem methods sandboxd serves
METHODS: dict[str, Method] = {
    "Stat": _stat_method, "ListDir": _list_dir, "MakeDir": _make_dir, "Move": _move,
    "Remove": _remove, "CreateWatcher": _create_watcher, "GetWatcherEvents": _watcher_events,
    "RemoveWatcher": _remove_watcher,
}


async def _snapshot(request: Request, client: str, record: E2bSandbox, where: str,
                    recursive: bool) -> watch.Snapshot:
    root = request.app.state.service.sessions.get(record.id, client).workspace
    try:
        return await asyncio.to_thread(watch.snapshot, str(root), where, recursive)
    except watch.WatchTooLarge as exc:
        raise connect.ConnectError("resource_exhausted", str(exc)) from None
    except (PathRefused, FileToolError) as exc:
        raise connect.ConnectError("failed_precondition", str(exc)) from None
