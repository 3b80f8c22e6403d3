"""SandboxClient / AsyncSandboxClient against the daemon's app in process (the client's side
of the API: tests/support/inprocess.py), a real daemon on a unix socket, and a stub for 429
handling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sandboxd_client import (
    AsyncSandboxClient,
    AuthenticationError,
    ConnectionFailed,
    InvalidArguments,
    NotFound,
    RateLimited,
    SandboxClient,
    ToolFailed,
)
from sandboxd_client.events import ToolOutput
from sandboxd_client.models import Result, ToolSpec
from tests.client.conftest import DAEMON_ARGS, InProcessTokenDaemon
from tests.client.stub_server import StubServer
from tests.support.daemon import free_port, uid_range_env
from tests.support.wait import wait_until


def test_tools_in_both_formats(inproc_token_daemon: InProcessTokenDaemon) -> None:
    with inproc_token_daemon.client() as client:
        specs = client.tools()
        openai = client.tools("openai")
    assert all(isinstance(t, ToolSpec) for t in specs)
    names = {t.name for t in specs}
    assert {"python", "shell", "read_file", "write_file", "list_files"} <= names
    available = [t for t in specs if t.available]
    assert [t["function"]["name"] for t in openai] == [t.name for t in available]
    for entry in openai:
        assert entry["type"] == "function"
        assert set(entry["function"]) == {"name", "description", "parameters"}


def test_unknown_token_is_typed_error_with_problem_details(
        inproc_token_daemon: InProcessTokenDaemon) -> None:
    with inproc_token_daemon.client(token="sbx_wrong") as client, \
            pytest.raises(AuthenticationError) as info:
        client.tools()
    err = info.value
    assert err.status == 401
    assert err.type.startswith("http") or err.type == "about:blank"
    assert err.title and err.detail
    assert err.problem["status"] == 401


def test_not_found_and_invalid_arguments(inproc_token_daemon: InProcessTokenDaemon) -> None:
    with inproc_token_daemon.client() as client:
        with pytest.raises(NotFound) as nf:
            client.invoke("no_such_tool", x=1)
        assert nf.value.status == 404 and "no_such_tool" in str(nf.value)
        with pytest.raises(NotFound):
            client.get_session("ses_doesnotexist")
        with pytest.raises(InvalidArguments) as bad:
            client.invoke("write_file", path="a.txt")  # content missing
        assert bad.value.status == 422
        assert bad.value.field == "content"
        assert bad.value.extra["tool"] == "write_file"


def test_sessions_and_file_helpers(inproc_token_daemon: InProcessTokenDaemon) -> None:
    with inproc_token_daemon.client() as client:
        with client.session(ttl_s=120) as s:
            assert s.id.startswith("ses_")
            assert s.info.client == "alice"
            written = s.write_file("notes/a.txt", "hello sandbox")
            assert written.status == "ok" and written.session == s.id
            assert s.read_file("notes/a.txt") == "hello sandbox"
            listing = s.list_files("notes")
            assert any(entry["name"] == "a.txt" for entry in listing)
            assert s.refresh().workspace_bytes >= len("hello sandbox")
            result = s.invoke("read_file", path="notes/a.txt")
            assert result.stdout == "hello sandbox"
            with pytest.raises(ToolFailed) as failed:
                s.read_file("missing.txt")
            assert failed.value.result.status != "ok"
            sid = s.id
        with pytest.raises(NotFound):  # deleted on exit
            client.get_session(sid)
        s.close()  # idempotent


def test_sessions_are_listed_and_restarted(inproc_token_daemon: InProcessTokenDaemon) -> None:
    with inproc_token_daemon.client() as client, \
            client.session() as s:
        assert s.id in [i.id for i in client.sessions()]
        assert s.invoke("python", code="x = 41").status == "ok"
        (listed,) = [i for i in client.sessions() if i.id == s.id]
        assert listed.kernel is not None and listed.kernel["live"] == bool(
            listed.kernel["backends"])
        restarted = s.restart()
        # the restart ended exactly the kernels the listing showed; none is left
        assert restarted.id == s.id and restarted.restarted == listed.kernel["backends"]
        assert restarted.kernel == {"live": False, "backends": []}
        assert not restarted.kernel_live and not s.refresh().kernel_live
        with pytest.raises(NotFound):
            client.restart_session("ses_nope")


def test_policy_denial_is_a_result_not_an_exception(
        inproc_token_daemon: InProcessTokenDaemon) -> None:
    with inproc_token_daemon.client() as client:
        result = client.invoke("shell", command="curl http://example.com")
        decision = client.explain("shell", {"command": "curl http://example.com"})
    assert result.status == "denied"
    assert result.message and "curl" in result.message
    assert result.policy is not None and result.policy.decision == "deny"
    # explain gives the same decision and rule without running anything
    assert decision["allowed"] is False
    assert decision["rule"] == result.policy.rule
    assert decision["source"] == result.policy.source


async def test_async_client(inproc_token_daemon: InProcessTokenDaemon) -> None:
    async with inproc_token_daemon.async_client() as client:
        assert await client.health()
        names = {t.name for t in await client.tools()}
        assert "write_file" in names
        async with client.session() as s:
            await s.write_file("x.txt", "async!")
            assert await s.read_file("x.txt") == "async!"
            assert (await s.refresh()).workspace_bytes >= len("async!")
            assert s.info.workspace_bytes >= len("async!")
            sid = s.id
        with pytest.raises(NotFound):
            await client.get_session(sid)
        with pytest.raises(InvalidArguments) as bad:
            await client.invoke("read_file")
        assert bad.value.field == "path"


def test_unix_socket(tmp_path: Path) -> None:
    sock = tmp_path / "sandboxd.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    env.update(uid_range_env())
    log = open(tmp_path / "uds.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandboxd", "serve", "--uds", str(sock),
         "--state-dir", str(tmp_path / "state"), *DAEMON_ARGS],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        client = SandboxClient(socket=sock)
        def up() -> bool:
            assert proc.poll() is None, (tmp_path / "uds.log").read_text()
            return client.health()

        wait_until(up, timeout=60, interval=0.1, what="the daemon to come up on the socket")
        with client, client.session() as s:
            s.write_file("over_uds.txt", "via unix socket")
            assert s.read_file("over_uds.txt") == "via unix socket"
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def test_connection_failure_is_typed() -> None:
    client = SandboxClient(f"http://127.0.0.1:{free_port()}", retries=1, max_retry_wait=0.1)
    with client, pytest.raises(ConnectionFailed):
        client.tools()


#: a header's value, or a function that makes it when the answer is sent (an HTTP-date "two
#: seconds from now" must be "now" for the server, not for the test that planned it)
Header = str | Callable[[], str]


def _rate_limited_app(plan: list[tuple[int, dict[str, Header]]], seen: list[float]) -> Starlette:
    ok = {"id": "inv_1", "tool": "python", "status": "ok",
          "termination": {"reason": "exited", "exit_code": 0}, "stdout": "done\n"}

    async def invoke(request: Request) -> JSONResponse:
        seen.append(time.monotonic())
        status, planned = plan[min(len(seen) - 1, len(plan) - 1)]
        headers = {k: v() if callable(v) else v for k, v in planned.items()}
        if status == 429:
            return JSONResponse({"type": "https://sandboxd.dev/problems/rate-limited",
                                 "title": "Too many requests", "status": 429,
                                 "detail": "queue full"}, status_code=429, headers=headers,
                                media_type="application/problem+json")
        return JSONResponse(ok)

    return Starlette(routes=[Route("/v1/tools/{name}/invoke", invoke, methods=["POST"])])


def test_429_retried_after_retry_after() -> None:
    seen: list[float] = []
    retried: list[tuple[str, int, float]] = []
    plan: list[tuple[int, dict[str, Header]]] = [
        (429, {"Retry-After": "1"}), (429, {"Retry-After": "1"}), (200, {})]
    with StubServer(_rate_limited_app(plan, seen)) as stub, SandboxClient(
            stub.url, retries=2,
            on_retry=lambda e, n, wait: retried.append((type(e).__name__, n, wait))) as client:
        result = client.invoke("python", code="print('done')")
    assert result.stdout == "done\n"
    assert len(seen) == 3
    assert retried == [("RateLimited", 1, 1.0), ("RateLimited", 2, 1.0)]
    # the client waited as long as the server asked, each time
    assert seen[1] - seen[0] >= 0.95 and seen[2] - seen[1] >= 0.95


async def test_429_http_date_and_exhausted_retries() -> None:
    seen: list[float] = []
    def date() -> str:  # two seconds from when the server answers, at second resolution
        return time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 2))

    plan: list[tuple[int, dict[str, Header]]] = [(429, {"Retry-After": date})]
    with StubServer(_rate_limited_app(plan, seen)) as stub:
        async with AsyncSandboxClient(stub.url, retries=1, max_retry_wait=5) as client:
            with pytest.raises(RateLimited) as info:
                await client.invoke("python", code="1")
    assert len(seen) == 2  # one retry, then the error
    assert seen[1] - seen[0] >= 0.5  # waited for the HTTP-date (second resolution)
    assert info.value.retry_after is not None and info.value.retry_after <= 2.5
    assert info.value.detail == "queue full"


def test_bearer_token_is_sent() -> None:
    got: list[str | None] = []

    async def tools(request: Request) -> JSONResponse:
        got.append(request.headers.get("authorization"))
        return JSONResponse([])

    app = Starlette(routes=[Route("/v1/tools", tools)])
    with StubServer(app) as stub, SandboxClient(stub.url, token="sbx_abc") as client:
        assert client.tools() == []
    assert got == ["Bearer sbx_abc"]
    assert isinstance(httpx.__version__, str)


def test_names_cannot_escape_their_path_segment() -> None:
    paths: list[str] = []

    async def record(request: Request) -> JSONResponse:
        paths.append(request.scope["raw_path"].decode())
        return JSONResponse({"type": "about:blank", "title": "Not found", "status": 404,
                             "detail": "nope"}, status_code=404)

    app = Starlette(routes=[Route("/{rest:path}", record, methods=["GET", "POST", "DELETE"])])
    with StubServer(app) as stub, SandboxClient(stub.url) as client:
        with pytest.raises(NotFound):
            client.invoke("../sessions?x=1#", code="1")
        with pytest.raises(NotFound):
            client.get_session("../tools/python")
    assert paths == ["/v1/tools/..%2Fsessions%3Fx%3D1%23/invoke",
                     "/v1/sessions/..%2Ftools%2Fpython"]


def test_answers_of_a_newer_daemon_still_parse() -> None:
    newer = {"id": "inv_1", "tool": "python", "status": "ok", "shiny_new_field": 1,
             "termination": {"reason": "exited", "exit_code": 0, "core_dumped": False},
             "stdout": "hi\n"}

    async def invoke(request: Request) -> JSONResponse:
        return JSONResponse(newer)

    async def broken(request: Request) -> JSONResponse:
        return JSONResponse({**newer, "status": "exploded"})

    app = Starlette(routes=[Route("/v1/tools/python/invoke", invoke, methods=["POST"]),
                            Route("/v1/tools/bad/invoke", broken, methods=["POST"])])
    with StubServer(app) as stub, SandboxClient(stub.url) as client:
        result = client.invoke("python", code="print('hi')")
        assert result.stdout == "hi\n" and result.termination.exit_code == 0
        with pytest.raises(ValueError, match="status"):  # a real mismatch still fails
            client.invoke("bad", code="1")


def test_a_newer_daemon_s_stream_still_parses() -> None:
    """The streamed display items and result of a newer daemon (members this client does not
    know) parse as the plain answer does; a real mismatch still fails."""
    newer = {"id": "inv_1", "tool": "python", "status": "ok", "shiny_new_field": 1,
             "termination": {"reason": "exited", "exit_code": 0, "core_dumped": False},
             "stdout": "hi\n"}
    display = {"type": "display", "data": {"text/plain": "7"}, "glossy": True}

    def sse(result: dict[str, object]) -> Response:
        body = (f"event: stdout\ndata: {json.dumps({'text': 'hi'})}\n\n"
                f"event: display\ndata: {json.dumps(display)}\n\n"
                f"event: result\ndata: {json.dumps(result)}\n\n")
        return Response(body, media_type="text/event-stream")

    async def invoke(request: Request) -> Response:
        return sse(newer)

    async def broken(request: Request) -> Response:
        return sse({**newer, "status": "exploded"})

    app = Starlette(routes=[Route("/v1/tools/python/invoke", invoke, methods=["POST"]),
                            Route("/v1/tools/bad/invoke", broken, methods=["POST"])])
    with StubServer(app) as stub, SandboxClient(stub.url) as client:
        items = list(client.invoke_stream("python", {"code": "print('hi')"}))
        shown = [i for i in items if isinstance(i, ToolOutput) and i.kind == "display"]
        assert shown and shown[0].item is not None and shown[0].item.data == {"text/plain": "7"}
        assert isinstance(items[-1], Result) and items[-1].stdout == "hi\n"
        with pytest.raises(ValueError, match="status"):
            list(client.invoke_stream("bad", {"code": "1"}))
