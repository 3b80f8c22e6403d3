"""The real daemon's app in this process: fast API, client and MCP tests without a daemon
start (CI's emulated VM job is slow).

:class:`InProcessDaemon` is ``sandboxd serve`` minus the process and the socket: the real
FastAPI app (:func:`sandboxd.api.app.create_app`, every middleware, the problem table, the
policy engine, the audit log, sessions and the workspace file tools) wired to a
:class:`~sandboxd.service.Sandboxd` whose execution backends are scripted
(:mod:`sandboxd.backends.scripted`), on an event loop of its own in a thread, its lifespan
run as uvicorn runs it. Requests reach it through in-process transports (no socket): a sync
one for ``httpx.Client`` and :class:`~sandboxd_client.SandboxClient`, an async one for
``httpx.AsyncClient`` (the MCP SDK's client). Unlike ``httpx.ASGITransport`` they stream
the response as the app sends it (server-sent events, the MCP notification stream), and
closing a response tells the app that its client went away (``http.disconnect``).

What they do not do: request bodies arrive whole (one ``http.request`` message), and
nothing below HTTP exists (connections, slow clients, signals, sockets, confinement): tests
of those start a real daemon (:mod:`tests.support.daemon`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import os
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import unquote, urlsplit

import httpx

from sandboxd.api.app import create_app
from sandboxd.backends.scripted import NOTHING_TO_CLEAN, Script, ScriptedBackend, prints
from sandboxd.config import Settings
from sandboxd.host import uidclaim
from sandboxd.models import Invocation, Limits, Reason, Result
from sandboxd.results.items import Output
from sandboxd.service import Sandboxd
from tests.support.daemon import TEST_DEFAULTS, daemon_env

URL = "http://localhost"
#: the settings every in-process daemon gets unless the test says otherwise: those of a test
#: daemon (TEST_DEFAULTS), and workspaces without a tmpfs mount each (the scripted backends
#: run nothing in them; the quota's kernel side is tests/security's and tests/service's)
INPROCESS_DEFAULTS = {**TEST_DEFAULTS, "SANDBOXD_WORKSPACE_QUOTA": "advisory"}
Deliver = Callable[[tuple[Any, ...]], None]


def answers(stdout: str = "", *, value: Any = None, stderr: str = "",
            displays: list[Any] | None = None, exit_code: int = 0) -> Script:
    """A script whose every call ends as a real one that printed ``stdout`` and evaluated
    to ``value`` (``displays``: the JSON values it passed to ``display()``, as the real
    backends report them: ``text/plain`` is their repr)."""
    outputs = [Output(data={"text/plain": repr(d), "application/json": d})
               for d in displays or []]

    def script(call: Invocation, limits: Limits) -> Result:
        return Result.build(call, None, Reason.exited, exit_code=exit_code, stdout=stdout,
                            stderr=stderr, value=value, outputs=outputs, limits=limits,
                            cleanup=NOTHING_TO_CLEAN)

    return script


def by_code(scripts: Mapping[str, Script], default: Script | None = None) -> Script:
    """A script answering each call like ``scripts[its code]`` (``default`` otherwise: prints
    nothing): one backend that plays several realistic calls."""
    fallback = default or prints("")

    def script(call: Invocation, limits: Limits) -> Result | Any:
        return scripts.get(str(call.arguments.get("code", call.arguments.get("command"))),
                           fallback)(call, limits)

    return script


def settings_from_env(state_dir: Path, env: Mapping[str, str] | None = None,
                      policies_dir: Path | None = None) -> Settings:
    """The settings ``sandboxd serve --state-dir state_dir`` would get from ``env`` (the
    ``SANDBOXD_*`` variables a test passes to :func:`tests.support.daemon.running_daemon`):
    read from the environment a test daemon gets (:func:`~tests.support.daemon.daemon_env`,
    a free sandbox uid range included), as the daemon reads them."""
    full = daemon_env({**INPROCESS_DEFAULTS, **(env or {})})
    fields: dict[str, Any] = {"state_dir": state_dir}
    if policies_dir is not None:
        fields["policies_dir"] = policies_dir
    with mock.patch.dict(os.environ, full, clear=True):
        return Settings(**fields)


def _claimed_settings(state_dir: Path, env: Mapping[str, str] | None,
                      policies_dir: Path | None) -> tuple[Settings, uidclaim.UidClaim | None]:
    """Settings whose sandbox uid range this process claimed host-wide, as ``serve`` claims
    its own (no claim when not root); another range when a parallel run took the one picked."""
    for _ in range(4):
        settings = settings_from_env(state_dir, env, policies_dir)
        try:
            return settings, uidclaim.claim_for(settings)
        except uidclaim.UidRangeTaken:
            continue
    raise RuntimeError("four sandbox uid ranges in a row were claimed by others")


def seccomp_mode() -> int:
    """This process's seccomp mode (``Seccomp:`` of /proc/self/status; 0: no filter)."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("Seccomp:"):
                return int(line.split()[1])
    return 0


class InProcessDaemon:
    """The app of a daemon on scripted backends, served in this process (module docstring).

    Quacks like :class:`~tests.support.daemon.RunningDaemon` for HTTP tests: ``url``,
    ``client``, ``headers``, ``invoke``, ``state_dir``, ``audit_path``; ``anon`` is a client
    without the token, ``http()`` makes others. ``python`` and ``container`` are the
    scripted backends (set their ``script``)."""

    def __init__(self, tmp_path: Path, *, script: Script | None = None,
                 env: Mapping[str, str] | None = None, policies_dir: Path | None = None,
                 token: str | None = None, state_dir: Path | None = None) -> None:
        self.state_dir = state_dir or tmp_path / "state"
        self.settings, self._claim = _claimed_settings(self.state_dir, env, policies_dir)
        if self.settings.workspace_quota != "advisory":
            # a daemon that may mount starts its mount helper and then installs a seccomp
            # filter on itself that refuses mount(2): here "itself" is the test process, and
            # every later test that mounts would fail (tests/service and tests/security run
            # that kind of daemon as a process of its own)
            if self._claim is not None:
                self._claim.release()
            raise ValueError("an in-process daemon runs with workspace_quota=advisory only "
                             "(kernel quotas: use tests.support.daemon.running_daemon)")
        self.audit_path = self.settings.audit_path
        self.url = URL
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.python = ScriptedBackend("restricted", script)
        self.container = ScriptedBackend("container", script)
        from sandboxd.backends.workspace import WorkspaceBackend

        backends: dict[str, Any] = {"workspace": WorkspaceBackend(
            quota_bytes=self.settings.session_quota_bytes,
            quota_entries=self.settings.session_quota_entries)}
        if self.settings.restricted_enabled:
            backends["restricted"] = self.python
        if self.settings.container_enabled:
            backends["container"] = self.container
        self.service = Sandboxd(self.settings, backends=backends)
        self.app = create_app(self.settings, service=self.service)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="inprocess-daemon",
                                        daemon=True)
        self._lifespan: contextlib.AbstractAsyncContextManager[Any] | None = None
        self.transport = SyncAppTransport(self)
        self.client = httpx.Client(transport=self.transport, base_url=self.url,
                                   headers=self.headers, timeout=120.0)
        #: a client without a token (``httpx.get(daemon.url + path)`` of a real daemon)
        self.anon = self.http(timeout=120.0)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> InProcessDaemon:
        """Start the loop, run the lifespan's start-up (the service, the self-test: raises
        what ``serve`` would exit with)."""
        self._thread.start()
        try:
            self._run(self._startup(), timeout=120)
        except BaseException:
            self._stop_loop()
            raise
        return self

    def stop(self) -> None:
        """The lifespan's shutdown (drain, close: the audit's shutdown record), then the loop.
        Then the check that the daemon left the test process as it found it: no seccomp
        filter (the daemon's mount-refusing one would break every later test that mounts)."""
        self.client.close()
        self.anon.close()
        try:
            if self._lifespan is not None:
                self._run(self._shutdown(), timeout=120)
        finally:
            self._stop_loop()
        assert seccomp_mode() == 0, "an in-process daemon filtered the test process's syscalls"

    async def _startup(self) -> None:
        lifespan = self.app.router.lifespan_context(self.app)
        await lifespan.__aenter__()
        self._lifespan = lifespan

    async def _shutdown(self) -> None:
        lifespan, self._lifespan = self._lifespan, None
        assert lifespan is not None
        await lifespan.__aexit__(None, None, None)

    def _stop_loop(self) -> None:
        async def cancel_the_rest() -> None:
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        if self._thread.is_alive():
            self._run(cancel_the_rest(), timeout=30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
        self.loop.close()
        if self._claim is not None:
            self._claim.release()

    def _run(self, coro: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    # ------------------------------------------------------------ clients

    def invoke(self, tool: str, arguments: dict, **body: object) -> httpx.Response:
        """POST /v1/tools/{tool}/invoke."""
        return self.client.post(f"/v1/tools/{tool}/invoke", json={"arguments": arguments, **body})

    def http(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        """Another sync client of this daemon (``token``: its bearer token)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(transport=self.transport, base_url=self.url,
                            headers={**headers, **kwargs.pop("headers", {})}, **kwargs)

    def async_transport(self) -> AsyncAppTransport:
        """A transport for an ``httpx.AsyncClient`` of this daemon (on the caller's loop)."""
        return AsyncAppTransport(self)

    def records(self) -> list[dict[str, Any]]:
        """The audit log's records so far."""
        from tests.support.audit import audit_records

        return audit_records(self.audit_path)

    # ------------------------------------------------------------ one exchange

    def exchange(self, request: httpx.Request, body: bytes, deliver: Deliver,
                 ) -> tuple[asyncio.Event, Any]:
        """Start ``request`` in the app; its messages go to ``deliver`` (from the daemon's
        loop): ``("start", status, headers)``, ``("body", bytes)``, ``("end",)`` or
        ``("error", exc)``. Returns the event that tells the app its client left, and the
        exchange's future (cancel it to abandon the request)."""
        left = asyncio.Event()  # bound to the daemon's loop at its first wait
        future = asyncio.run_coroutine_threadsafe(
            self._exchange(_scope(request), body, deliver, left), self.loop)
        return left, future

    async def _exchange(self, scope: dict[str, Any], body: bytes, deliver: Deliver,
                        left: asyncio.Event) -> None:
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                deliver(("start", message["status"], message.get("headers", [])))
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    deliver(("body", message["body"]))
                if not message.get("more_body", False):
                    deliver(("end",))

        try:
            await self.app(scope, receive, send)
        except Exception as exc:  # what uvicorn would log and answer 500 to
            deliver(("error", exc))
        finally:
            deliver(("end",))

    def disconnect(self, left: asyncio.Event) -> None:
        """Tell the app that the client of an exchange went away."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to tell
            self.loop.call_soon_threadsafe(left.set)


def _scope(request: httpx.Request) -> dict[str, Any]:
    url = request.url
    # the request target as a client sent it (dot segments kept, which httpx's URL removes):
    # the ``raw_target`` extension of :func:`requests_session`'s requests
    target: bytes = request.extensions.get("raw_target", url.raw_path)
    raw_path, _, query = target.partition(b"?")
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": request.method, "scheme": url.scheme,
        "path": unquote(raw_path.decode("latin-1")), "raw_path": raw_path,
        "query_string": query, "root_path": "",
        "headers": [(k.lower(), v) for k, v in request.headers.raw],
        "server": (url.host, url.port or 80), "client": ("127.0.0.1", 50000), "state": {},
    }


def _timeout(request: httpx.Request) -> float | None:
    return request.extensions.get("timeout", {}).get("read")


def _http_of(request: Any) -> Any:
    """The module of ``request``: httpx, or httpx2 (the MCP SDK's client), which has the same
    API but classes of its own."""
    return importlib.import_module(type(request).__module__.split(".")[0])


def _response(first: tuple[Any, ...], stream: Any, request: Any) -> Any:
    http = _http_of(request)
    if first[0] == "error":
        raise first[1]
    if first[0] != "start":
        raise http.RemoteProtocolError("the app ended without a response", request=request)
    return http.Response(first[1], headers=first[2], stream=stream, request=request)


class SyncAppTransport(httpx.BaseTransport):
    """``httpx.Client``'s way into an :class:`InProcessDaemon`."""

    def __init__(self, daemon: InProcessDaemon) -> None:
        self.daemon = daemon

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        items: queue.Queue[tuple[Any, ...]] = queue.Queue()
        left, future = self.daemon.exchange(request, request.read(), items.put)
        timeout = _timeout(request)
        try:
            first = items.get(timeout=timeout)
        except queue.Empty:
            future.cancel()
            raise httpx.ReadTimeout("the in-process daemon did not answer in time",
                                    request=request) from None
        return _response(first, _SyncBody(self.daemon, items, left, timeout), request)


class _SyncBody(httpx.SyncByteStream):
    def __init__(self, daemon: InProcessDaemon, items: queue.Queue[tuple[Any, ...]],
                 left: asyncio.Event, timeout: float | None) -> None:
        self.daemon, self.items, self.left, self.timeout = daemon, items, left, timeout

    def __iter__(self) -> Iterator[bytes]:
        while True:
            try:
                item = self.items.get(timeout=self.timeout)
            except queue.Empty:
                raise httpx.ReadTimeout("the in-process daemon stopped sending") from None
            if item[0] == "body":
                yield item[1]
            elif item[0] == "error":
                raise httpx.RemoteProtocolError(f"the app failed: {item[1]!r}")
            else:
                return

    def close(self) -> None:
        self.daemon.disconnect(self.left)


class AsyncAppTransport(httpx.AsyncBaseTransport):
    """``httpx.AsyncClient``'s (or ``httpx2.AsyncClient``'s) way into an
    :class:`InProcessDaemon` (from any event loop)."""

    def __init__(self, daemon: InProcessDaemon) -> None:
        self.daemon = daemon

    async def handle_async_request(self, request: Any) -> Any:
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()

        def deliver(item: tuple[Any, ...]) -> None:
            with contextlib.suppress(RuntimeError):  # the caller's loop is gone
                loop.call_soon_threadsafe(items.put_nowait, item)

        left, future = self.daemon.exchange(request, await request.aread(), deliver)
        try:
            first = await asyncio.wait_for(items.get(), _timeout(request))
        except BaseException:  # timed out or cancelled: the client is gone
            future.cancel()
            self.daemon.disconnect(left)
            raise
        body = _async_body(_http_of(request))(self.daemon, items, left)
        return _response(first, body, request)


@functools.cache
def _async_body(http: Any) -> type:
    """The streamed body of a response, an ``AsyncByteStream`` of ``http`` (httpx, httpx2)."""

    class AsyncBody(http.AsyncByteStream):  # type: ignore[misc,name-defined]
        def __init__(self, daemon: InProcessDaemon, items: asyncio.Queue[tuple[Any, ...]],
                     left: asyncio.Event) -> None:
            self.daemon, self.items, self.left = daemon, items, left

        async def __aiter__(self) -> AsyncIterator[bytes]:
            while True:
                item = await self.items.get()
                if item[0] == "body":
                    yield item[1]
                elif item[0] == "error":
                    raise http.RemoteProtocolError(f"the app failed: {item[1]!r}")
                else:
                    return

        async def aclose(self) -> None:
            self.daemon.disconnect(self.left)

    return AsyncBody


@contextlib.contextmanager
def inprocess_daemon(tmp_path: Path, **kwargs: Any) -> Iterator[InProcessDaemon]:
    """An :class:`InProcessDaemon`, started; stopped (drained, closed) on exit."""
    daemon = InProcessDaemon(tmp_path, **kwargs).start()
    try:
        yield daemon
    finally:
        daemon.stop()


def requests_session(daemon: InProcessDaemon) -> Any:
    """A ``requests.Session`` whose every request goes to ``daemon`` in process (through its
    sync transport, headers and body as ``requests`` prepared them): for a library that
    speaks ``requests``, e.g. schemathesis's ``case.call(session=...)``."""
    import requests
    from urllib3 import HTTPResponse
    from urllib3._collections import HTTPHeaderDict

    class Adapter(requests.adapters.BaseAdapter):
        client = daemon.http(timeout=120.0)

        def send(self, request: requests.PreparedRequest, stream: bool = False,
                 timeout: Any = None, verify: Any = True, cert: Any = None,
                 proxies: Any = None) -> requests.Response:
            body = request.body.encode() if isinstance(request.body, str) else request.body
            target = urlsplit(request.url or "")
            raw = (target.path or "/") + (f"?{target.query}" if target.query else "")
            got = self.client.request(request.method or "GET", request.url or "",
                                      headers=dict(request.headers), content=body,
                                      extensions={"raw_target": raw.encode("ascii")})
            headers = HTTPHeaderDict()
            for name, value in got.headers.multi_items():
                headers.add(name, value)
            response = requests.Response()
            response.status_code, response.reason = got.status_code, got.reason_phrase
            response.headers = requests.structures.CaseInsensitiveDict(headers)
            response.raw = HTTPResponse(body=b"", headers=headers, status=got.status_code,
                                        version=11, preload_content=False)
            response._content, response.encoding = got.content, got.encoding
            response.url, response.request = request.url or "", request
            response.elapsed = got.elapsed
            return response

        def close(self) -> None:
            self.client.close()

    session = requests.Session()
    session.mount(daemon.url, Adapter())
    return session
