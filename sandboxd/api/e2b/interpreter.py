"""E2B's code interpreter (``/execute`` and ``/contexts``): ``run_code`` is the ``python``
tool in the sandbox's session, through :meth:`Sandboxd.invoke` as any native call.

``/execute`` answers JSON lines as E2B's server does: ``stdout``/``stderr`` chunks as the
kernel writes them, a ``result`` per display item (and the cell's last value as the main
result), ``error`` (name, value, traceback), ``number_of_executions``, ``end_of_execution``.
A call the policy refuses is an HTTP error before any line (the SDK raises it). A caller that
goes away (the SDK's ``timeout``) interrupts the kernel, which keeps its variables, as E2B's
server interrupts Jupyter's.

A context is a kernel: the default one is the sandbox's session's, each extra context is a
session of its own (so its own workspace: what differs from E2B, docs/e2b.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from sandboxd.api.e2b import languages, results
from sandboxd.api.e2b.access import E2bRoute, e2b_client, json_body, sandbox_id
from sandboxd.api.e2b.sandboxes import (
    HOME,
    TRANSPORT,
    E2bSandbox,
    Sandboxes,
    workspace_path,
)
from sandboxd.api.problems import Problem
from sandboxd.models import InvokeRequest, Result, Status
from sandboxd.protocol.environment import check_env
from sandboxd.results.streaming import StreamEvent
from sandboxd.service import Sandboxd
from sandboxd.sessions.record import SessionNotFound

router = APIRouter(route_class=E2bRoute, include_in_schema=False)
_PIP = re.compile(r"^[!%]pip3? install\s+\S")
#: interrupts under way after their caller left (each waits for its call to end)
_LEFT: set[asyncio.Task[Any]] = set()


def _sandboxes(request: Request) -> Sandboxes:
    sandboxes: Sandboxes = request.app.state.e2b
    return sandboxes


def _interpreter(request: Request, client: str) -> E2bSandbox:
    record = _sandboxes(request).get(client, sandbox_id(request))
    if record.kind != "python":
        raise Problem(400, "e2b-no-interpreter", "No code interpreter",
                      f"sandbox {record.id} runs template '{record.template}', which has no "
                      "code interpreter (the e2b_templates setting maps it to 'shell')")
    return record


def _context_session(record: E2bSandbox, context_id: str | None) -> str:
    if not context_id or context_id == record.id:
        return record.id
    if context_id not in record.contexts:
        raise SessionNotFound(f"context '{context_id}' does not exist in sandbox {record.id}")
    return context_id


def pip_install(code: str) -> list[str] | None:
    """The packages of a cell that is only Jupyter's ``!pip install``/``%pip install``
    lines (what frameworks send to install their requirements), else None. Such a cell is
    the ``install_packages`` tool: from the administrator's wheelhouse, as the policy
    allows (its schema refuses options and URLs)."""
    lines = [line.strip() for line in code.splitlines() if line.strip()]
    if not lines or not all(_PIP.match(line) for line in lines):
        return None
    return [name for line in lines for name in line.split()[2:]]


@router.post("/execute")
async def execute(request: Request, client: str = Depends(e2b_client)) -> Response:
    record = _interpreter(request, client)
    body = await json_body(request)
    if not isinstance(body.get("code"), str):
        raise Problem(400, "e2b-execute", "Bad request", "the body is {\"code\": \"...\"}")
    session = _context_session(record, body.get("context_id"))
    name, _ = languages.language(record.languages.get(session) if session != record.id
                                 else body.get("language"))
    envs = _checked(body.get("env_vars"), "envs")
    service: Sandboxd = request.app.state.service
    queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
    started = asyncio.Event()
    tool, arguments = _tool_call(service, record, session, name, body["code"], envs)
    call = asyncio.create_task(service.invoke(
        client, tool, InvokeRequest(arguments=arguments, session=session),
        transport=TRANSPORT, events=queue.put_nowait, started=started))
    begun = asyncio.create_task(started.wait())
    try:
        await asyncio.wait({call, begun}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        begun.cancel()
    if call.done():
        result = call.result()  # a refusal raises here: the SDK gets the error
        if result.status in (Status.denied, Status.rejected):
            return JSONResponse({"code": 403, "message": results.refusal(result)},
                                status_code=403)
    return StreamingResponse(_lines(service, client, session, call, queue),
                             media_type="application/x-ndjson")


def _tool_call(service: Sandboxd, record: E2bSandbox, session: str, language: str,
               code: str, envs: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """The tool a cell calls and its arguments: ``install_packages`` for a Python cell of
    ``pip install`` lines only, else the language's tool with the cell (:func:`_cell`)."""
    packages = pip_install(code) if language == "python" else None
    if packages:
        return "install_packages", {"packages": packages}
    return (languages.LANGUAGES[language].tool,
            {"code": _cell(service, record, session, language, code, envs)})


async def _lines(service: Sandboxd, client: str, session: str, call: asyncio.Task[Result],
                 queue: asyncio.Queue[StreamEvent]) -> AsyncIterator[bytes]:
    finished = False
    try:
        while not call.done() or not queue.empty():
            line = await _next_line(call, queue)
            if line is not None:
                yield _line(line)
        for line in results.final_lines(call.result()):
            yield _line(line)
        finished = True
    finally:
        if not finished and not call.done():  # the caller left (its timeout): interrupt
            task = asyncio.ensure_future(_interrupt(service, client, session, call))
            _LEFT.add(task)
            task.add_done_callback(_LEFT.discard)


async def _next_line(call: asyncio.Task[Result], queue: asyncio.Queue[StreamEvent]
                     ) -> dict[str, Any] | None:
    """The line of the call's next event (``None``: the call ended first, or the event is
    nothing E2B shows)."""
    get = asyncio.ensure_future(queue.get())
    done, _ = await asyncio.wait({get, call}, return_when=asyncio.FIRST_COMPLETED)
    if get not in done:
        get.cancel()
        return None
    return results.event_line(get.result())


async def _interrupt(service: Sandboxd, client: str, session: str,
                     call: asyncio.Task[Result]) -> None:
    """Interrupt the kernel of a call nobody listens to any more (its variables stay), and
    let the call end by itself: audited, cleaned up, as any call."""
    with contextlib.suppress(Exception):
        await service.interrupt_session(client, session, transport=TRANSPORT)
    with contextlib.suppress(BaseException):
        await call


def _checked(envs: Any, what: str) -> dict[str, str]:
    try:
        return check_env(envs, what)
    except ValueError as exc:
        raise Problem(400, "e2b-envs", "Environment refused", str(exc)) from None


def _cell(service: Sandboxd, record: E2bSandbox, session: str, language: str, code: str,
          envs: dict[str, str]) -> str:
    """The cell's code, preceded by what sets the sandbox's and the cell's variables (and
    unsets the previous cell's own), :mod:`~sandboxd.api.e2b.languages`. Not on the
    restricted backend: its Python cannot import ``os``, so no cell there can read them."""
    if (not record.envs and not envs and not record.cell_envs) or _restricted(
            service, record.client, languages.LANGUAGES[language].tool):
        return code
    key = f"{session}/{language}"
    previous = record.cell_envs.pop(key, [])
    if envs:
        record.cell_envs[key] = sorted(envs)
    return languages.with_envs(languages.LANGUAGES[language], code, record.envs, envs,
                               previous)


def _restricted(service: Sandboxd, client: str, tool: str) -> bool:
    """Whether the client's policy runs ``tool`` on the restricted backend."""
    return any(s.backend == "restricted" for s in service.policy.tools_for(client)
               if s.name == tool)


def _line(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


def _context(context_id: str, cwd: str, language: str = languages.DEFAULT) -> dict[str, str]:
    return {"id": context_id, "language": language, "cwd": cwd}


def _cwd_code(language: str, where: str) -> str:
    """The code that makes and enters a context's directory (a call of its tool: the policy
    decides it)."""
    if language == "bash":
        return f"mkdir -p -- {shlex.quote(where)} && cd -- {shlex.quote(where)}"
    if languages.LANGUAGES[language].tool in ("javascript", "typescript"):
        return (f"require('fs').mkdirSync({json.dumps(where)}, {{recursive: true}})\n"
                f"process.chdir({json.dumps(where)})")
    return f"import os\nos.makedirs({where!r}, exist_ok=True)\nos.chdir({where!r})"


@router.post("/contexts")
async def create_context(request: Request, client: str = Depends(e2b_client)) -> Response:
    record = _interpreter(request, client)
    body = await json_body(request)
    name, _ = languages.language(body.get("language"))
    cwd = body.get("cwd") or HOME
    if not isinstance(cwd, str):
        raise Problem(400, "e2b-body", "Bad request", "cwd is a path")
    where = workspace_path(cwd)
    service: Sandboxd = request.app.state.service
    sandboxes = _sandboxes(request)
    session = await service.create_session(
        client, sandboxes.expires_at(record) - time.time(), transport=TRANSPORT)
    if where != ".":  # the kernel starts there
        await _enter(service, client, session.id, name, cwd, where)
    record.contexts[session.id] = cwd
    if name != languages.DEFAULT:
        record.languages[session.id] = name
    await asyncio.to_thread(sandboxes.save, record)
    return JSONResponse(_context(session.id, cwd, name))


async def _enter(service: Sandboxd, client: str, session: str, language: str, cwd: str,
                 where: str) -> None:
    """Make and enter a new context's directory (a call of its language's tool: the policy
    decides it); refused or failed, the context's session is deleted and a problem raised."""
    result = await service.invoke(
        client, languages.LANGUAGES[language].tool,
        InvokeRequest(arguments={"code": _cwd_code(language, where)}, session=session),
        transport=TRANSPORT)
    if result.status is not Status.ok:
        await service.delete_session(client, session, transport=TRANSPORT)
        raise Problem(403 if result.status is Status.denied else 400, "e2b-context-cwd",
                      "Context not created", f"cwd {cwd}: {results.refusal(result)}")


@router.get("/contexts")
async def list_contexts(request: Request, client: str = Depends(e2b_client)) -> Response:
    record = _interpreter(request, client)
    return JSONResponse([_context(record.id, HOME)]
                        + [_context(c, cwd, record.languages.get(c, languages.DEFAULT))
                           for c, cwd in record.contexts.items()])


@router.post("/contexts/{context_id}/restart")
async def restart_context(context_id: str, request: Request,
                          client: str = Depends(e2b_client)) -> Response:
    record = _interpreter(request, client)
    session = _context_session(record, context_id)
    service: Sandboxd = request.app.state.service
    await service.restart_session(client, session, transport=TRANSPORT)
    return Response(status_code=204)


@router.delete("/contexts/{context_id}")
async def remove_context(context_id: str, request: Request,
                         client: str = Depends(e2b_client)) -> Response:
    record = _interpreter(request, client)
    if context_id == record.id:
        raise Problem(400, "e2b-default-context", "Default context",
                      "the default context is the sandbox's own kernel: restart it, or kill "
                      "the sandbox")
    _context_session(record, context_id)
    service: Sandboxd = request.app.state.service
    await service.delete_session(client, context_id, transport=TRANSPORT)
    record.contexts.pop(context_id, None)
    record.languages.pop(context_id, None)
    await asyncio.to_thread(_sandboxes(request).save, record)
    return Response(status_code=204)
