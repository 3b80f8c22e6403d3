"""envd's process service (Connect, JSON) onto :mod:`sandboxd.api.e2b.commands`: ``Start``
(the SDK's ``commands.run``, foreground or background), ``List`` and ``SendSignal``
(``commands.kill``), ``Connect`` (``commands.connect``: a running command's further
output), and ``SendInput`` and ``CloseStdin`` (``send_stdin``, ``close_stdin``) of a command
started with ``stdin``. The SDKs run ``/bin/bash -l -c <line>``: the line goes to the
``shell`` tool as it is, checked by the policy (no shell runs it); ``envs`` are the tool's
``env``. ``Update`` and ``StreamInput`` are not served: a clear Connect error.
"""

from __future__ import annotations

import asyncio
import base64
import shlex
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from sandboxd.api.e2b import commands, connect
from sandboxd.api.e2b.access import e2b_client, sandbox_id
from sandboxd.api.e2b.commands import Background
from sandboxd.api.e2b.results import refusal
from sandboxd.api.e2b.sandboxes import HOME, E2bSandbox, Sandboxes, workspace_path
from sandboxd.backends.stdin import Stdin, StdinRefused
from sandboxd.models import Result, Status
from sandboxd.protocol.environment import check_env
from sandboxd.results.streaming import StreamEvent
from sandboxd.sessions.record import SessionNotFound

router = APIRouter(include_in_schema=False)
SERVICE = "/process.Process/"
_SHELLS = ("/bin/bash", "bash", "/bin/sh", "sh", "/usr/bin/bash")
FIRST_PID = 1000


async def _record(request: Request) -> tuple[str, E2bSandbox]:
    client = await e2b_client(request)
    sandboxes: Sandboxes = request.app.state.e2b
    return client, sandboxes.get(client, sandbox_id(request))


def command_line(config: dict[str, Any]) -> str:
    """The command line a process config runs: the script of ``bash -l -c <line>``, else
    the program and its arguments quoted."""
    cmd, args = config.get("cmd") or "", list(config.get("args") or [])
    if _shell_script(cmd, args):
        return str(args[-1])
    if not cmd:
        raise connect.ConnectError("invalid_argument", "process.cmd names the program")
    return shlex.join([cmd, *map(str, args)])


def _shell_script(cmd: str, args: list[Any]) -> bool:
    """Whether ``cmd args`` is a shell running the script that ends ``args`` (``-c`` before
    it, nothing but ``-l`` ahead)."""
    return cmd in _SHELLS and len(args) >= 2 and args[-2] == "-c" and set(args[:-2]) <= {"-l"}


@router.get("/health")
async def health(request: Request) -> Response:
    """envd's health: 204 while the caller's sandbox lives, else 502, which the SDKs read as
    "not running" (what E2B's proxy answers for a sandbox that is gone)."""
    try:
        await _record(request)
    except SessionNotFound as exc:
        return JSONResponse({"code": 502, "message": str(exc)}, status_code=502)
    except Exception as exc:
        return connect.unary_error(exc)
    return Response(status_code=204)


@router.post(SERVICE + "Start")
async def start(request: Request) -> Response:
    try:
        client, record = await _record(request)
        message = await connect.stream_request(request)
        config, envs, line = _checked_start(record, message)
    except Exception as exc:
        return connect.stream_error(exc)
    pid = max([FIRST_PID - 1, *record.background]) + 1
    job = commands.start(request.app.state.service, client, record.id, pid, line, envs,
                         {"cmd": config.get("cmd") or "", "args": config.get("args") or [],
                          "envs": envs, "cwd": HOME},
                         Stdin() if message.get("stdin") else None)
    await commands.begun(job)
    refused = _ended_at_once(job)
    if refused is not None:
        return refused
    record.background[pid] = job
    job.task.add_done_callback(lambda _: record.background.pop(pid, None))
    return connect.stream_response(_events(job, job.listeners[0]))


def _checked_start(record: E2bSandbox, message: dict[str, Any]
                   ) -> tuple[dict[str, Any], dict[str, str], str]:
    """A ``Start``'s process config, its variables (the sandbox's, the command's own on top:
    E2B's order) and its command line; refused: a PTY, bad variables, a cwd other than the
    workspace."""
    config = message.get("process") or {}
    if message.get("pty"):
        raise connect.refuse("PTY")
    try:
        envs = {**record.envs, **check_env(config.get("envs"), "envs")}
    except ValueError as exc:
        raise connect.ConnectError("invalid_argument", str(exc)) from None
    if workspace_path(config.get("cwd") or HOME) != ".":
        raise connect.refuse(f"a command cwd other than {HOME} (the workspace)")
    return config, envs, command_line(config)


def _ended_at_once(job: Background) -> Response | None:
    """The error answer of a command that ended before it began to stream: it failed, or
    the policy denied or rejected it; None when it streams."""
    if not job.task.done():
        return None
    try:
        result = job.task.result()
    except Exception as exc:
        return connect.stream_error(exc)
    if result.status in (Status.denied, Status.rejected):
        return connect.stream_error(connect.ConnectError("permission_denied", refusal(result)))
    return None


@router.post(SERVICE + "Connect")
async def connect_process(request: Request) -> Response:
    """``commands.connect(pid)``: a stream of a running command's further output and its
    end, as ``Start``'s (another client process may watch it the same way)."""
    try:
        _, record = await _record(request)
        message = await connect.stream_request(request)
        job = _running(record, (message.get("process") or {}).get("pid"))
    except Exception as exc:
        return connect.stream_error(exc)
    return connect.stream_response(_events(job, job.listen()))


def _running(record: E2bSandbox, pid: object) -> Background:
    job = record.background.get(pid) if isinstance(pid, int) else None
    if job is None or job.task.done():
        raise connect.ConnectError("not_found", f"process {pid} not found")
    return job


async def _events(job: Background, events: asyncio.Queue[StreamEvent]
                  ) -> AsyncIterator[bytes]:
    try:
        yield connect.envelope({"event": {"start": {"pid": job.pid}}})
        while (event := await commands.next_event(job, events)) is not None:
            text = event.output()
            if text is not None:
                data = base64.b64encode(text.encode()).decode()
                yield connect.envelope({"event": {"data": {event.kind: data}}})
    finally:
        job.leave(events)
    try:
        result = job.task.result()
    except BaseException as exc:
        yield connect.end_of_stream(exc if isinstance(exc, Exception)
                                    else connect.ConnectError("canceled", "the command was killed"))
        return
    yield connect.envelope({"event": {"end": _end(result)}})
    yield connect.end_of_stream()


def _end(result: Result) -> dict[str, Any]:
    """envd's end event: the exit code (-1 when a signal or sandboxd ended it)."""
    code = result.termination.exit_code
    if result.status is Status.ok:
        code = code or 0
    end: dict[str, Any] = (
        {"exited": False, "exitCode": -1,
         "status": f"{result.status.value}: {result.termination.reason.value}"}
        if code is None else
        {"exited": code >= 0, "exitCode": code, "status": f"exit status {code}"})
    if result.status is not Status.ok and result.message:
        end["error"] = result.message
    return end


@router.post(SERVICE + "List")
async def list_processes(request: Request) -> Response:
    try:
        _, record = await _record(request)
        await connect.unary_request(request)
    except Exception as exc:
        return connect.unary_error(exc)
    return JSONResponse({"processes": [
        {"config": job.config, "pid": job.pid}
        for job in record.background.values() if not job.task.done()]})


@router.post(SERVICE + "SendSignal")
async def send_signal(request: Request) -> Response:
    """Any signal kills: a sandboxd call is cancelled as a whole."""
    try:
        _, record = await _record(request)
        message = await connect.unary_request(request)
        job = _running(record, (message.get("process") or {}).get("pid"))
    except Exception as exc:
        return connect.unary_error(exc)
    await job.stop()
    return JSONResponse({})


@router.post(SERVICE + "SendInput")
async def send_input(request: Request) -> Response:
    """``send_stdin``: bytes for the stdin of a command started with ``stdin=True``."""
    try:
        _, record = await _record(request)
        message = await connect.unary_request(request)
        _write_input(_stdin(record, message), message)
    except Exception as exc:
        return connect.unary_error(exc)
    return JSONResponse({})


def _write_input(stdin: Stdin, message: dict[str, Any]) -> None:
    """Write a ``SendInput``'s bytes (base64 in ``input.stdin``) to the command's stdin;
    ``invalid_argument`` when they are not base64 or the stdin refuses them."""
    data = (message.get("input") or {}).get("stdin") or ""
    try:
        if not isinstance(data, str):
            raise ValueError("input.stdin must be bytes (base64)")
        stdin.write(base64.b64decode(data, validate=True))
    except (ValueError, StdinRefused) as exc:  # binascii.Error is a ValueError
        raise connect.ConnectError("invalid_argument", f"stdin: {exc}") from None


@router.post(SERVICE + "CloseStdin")
async def close_stdin(request: Request) -> Response:
    """``close_stdin``: the command reads EOF once it has read what was sent."""
    try:
        _, record = await _record(request)
        _stdin(record, await connect.unary_request(request)).close()
    except Exception as exc:
        return connect.unary_error(exc)
    return JSONResponse({})


def _stdin(record: E2bSandbox, message: dict[str, Any]) -> Stdin:
    job = _running(record, (message.get("process") or {}).get("pid"))
    if job.stdin is None:
        raise connect.ConnectError(
            "failed_precondition", f"process {job.pid} was not started with stdin "
            "(commands.run(..., stdin=True)): its stdin is /dev/null")
    return job.stdin


@router.post(SERVICE + "{method}")
async def unserved(method: str) -> Response:
    return connect.unary_error(connect.refuse(f"process.{method}"))
