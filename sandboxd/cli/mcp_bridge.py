"""The stdio bridge's message pump (``sandboxd mcp``): each JSON-RPC line of the host goes, as
it is, to the daemon's Streamable HTTP endpoint (``/mcp``), and each message of the daemon back
as one line. It executes nothing and interprets no tool: the daemon's MCP front door is the one
MCP server (auth, tool lists, results, sessions, progress, cancellation, list_changed).

Only the transport is done here, for both protocol eras the door speaks:

* **handshake era** (2024-11-05 ... 2025-11-25): the ``Mcp-Session-Id`` of the ``initialize``
  answer and the negotiated ``MCP-Protocol-Version`` go on every later request; after
  ``notifications/initialized`` a ``GET`` stream carries the daemon's own notifications
  (``tools/list_changed``); at the end the session is ended (``DELETE``), so the daemon deletes
  its workspace.
* **2026-07-28** (stateless): a request whose ``_meta`` names that version gets the routing
  headers the transport requires (``MCP-Protocol-Version``, ``Mcp-Method``, ``Mcp-Name``);
  the host's ``notifications/cancelled`` of such a request closes its response stream (how
  that revision cancels over HTTP) instead of being posted.

Deliberately free of the MCP SDK and of the daemon's modules: a host waits for this process's
first answer, and the SDK alone takes most of a second to import
(``bench/bench_mcp_bridge.py``; ``tests/mcp/test_bridge_imports.py`` keeps them out).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx

from sandboxd.util.deadline import stop_task

EXIT_AUTH = 3
#: the version key of a 2026-07-28 request's ``_meta`` (the per-request envelope)
VERSION_META = "io.modelcontextprotocol/protocolVersion"
#: the body parameter each name-bearing method mirrors in ``Mcp-Name``
NAME_PARAMS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
_HEADER_SAFE = re.compile(r"[\x20-\x7E]*")
_B64_SENTINEL = re.compile(r"=\?base64\?.*\?=")
LINE_LIMIT = 64 * 2**20  # a line longer than any request body the daemon takes
DELETE_TIMEOUT_S = 5.0
#: what every POST to ``/mcp`` says it sends and takes
POST_HEADERS = {"accept": "application/json, text/event-stream",
                "content-type": "application/json"}


def say(message: str) -> None:
    """One line on stderr (an MCP host shows a server's stderr in its logs)."""
    sys.stderr.write(f"sandboxd mcp: {message}\n")
    sys.stderr.flush()


def header_value(value: str) -> str:
    """A value as the transport carries it in ``Mcp-Name``: printable ASCII as is, anything
    else base64 in the ``=?base64?...?=`` form."""
    if (_HEADER_SAFE.fullmatch(value) and value == value.strip()
            and not _B64_SENTINEL.fullmatch(value)):
        return value
    return f"=?base64?{base64.b64encode(value.encode()).decode()}?="


def _write(message: Any) -> None:
    """One message to the host: one line on stdout (whole, between two awaits)."""
    sys.stdout.buffer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    sys.stdout.buffer.flush()


def _field(value: Any, key: str) -> Any:
    """``value[key]`` when ``value`` is a JSON object, else None."""
    return value.get(key) if isinstance(value, dict) else None


def _stateless_headers(version: str, method: str, params: Any) -> dict[str, str]:
    """The routing headers a 2026-07-28 request carries (its version, method and name)."""
    headers = POST_HEADERS | {"mcp-protocol-version": version, "mcp-method": method}
    name = _field(params, NAME_PARAMS.get(method, ""))
    if isinstance(name, str):
        headers["mcp-name"] = header_value(name)
    return headers


def _session_headers(session_id: str, version: str | None,
                     headers: dict[str, str]) -> dict[str, str]:
    """``headers`` with a handshake-era session's id and, once negotiated, its version."""
    headers["mcp-session-id"] = session_id
    if version:
        headers["mcp-protocol-version"] = version
    return headers


async def _events(response: httpx.Response) -> AsyncIterator[str]:
    """The ``data`` of each server-sent event of ``response`` (comments and pings skipped)."""
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield "\n".join(data)
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield "\n".join(data)


class Bridge:
    """One host's connection to the daemon's ``/mcp``."""

    def __init__(self, http: httpx.AsyncClient, endpoint: str) -> None:
        self.http = http
        self.endpoint = endpoint
        self.session_id: str | None = None  # handshake era, from the initialize answer
        self.version: str | None = None  # handshake era, negotiated by initialize
        self.stateless: dict[Any, asyncio.Task[None]] = {}  # 2026-07-28 requests in flight
        self.tasks: set[asyncio.Task[None]] = set()
        self.listener: asyncio.Task[None] | None = None

    def _headers(self, message: dict[str, Any]) -> dict[str, str]:
        """The headers of one POST: a 2026-07-28 request's routing headers, else the
        handshake-era session's (its version on everything after ``initialize``)."""
        method = message.get("method")
        params = message.get("params")
        modern = _field(_field(params, "_meta"), VERSION_META)
        if isinstance(modern, str) and isinstance(method, str):
            return _stateless_headers(modern, method, params)
        headers = dict(POST_HEADERS)
        if self.session_id is not None:
            headers["mcp-session-id"] = self.session_id
        if self.version is not None and method != "initialize":
            headers["mcp-protocol-version"] = self.version
        return headers

    async def from_host(self, message: Any) -> None:
        """Send one message of the host on its way."""
        if not isinstance(message, dict):
            await self._post(message, dict(POST_HEADERS))
            return
        method = message.get("method")
        if method == "notifications/cancelled" and self._cancel_stateless(message):
            return
        headers = self._headers(message)
        if _posted_apart(message):
            self._start_request(message, headers)
            return
        await self._post(message, headers)  # notifications, answers, initialize: in order
        if method == "notifications/initialized":
            self._start_listener()

    def _start_listener(self) -> None:
        """Open the handshake era's notification stream, once, when a session exists."""
        if self.session_id and self.listener is None:
            self.listener = asyncio.create_task(self._listen())

    def _cancel_stateless(self, message: dict[str, Any]) -> bool:
        """Cancel the 2026-07-28 request a ``notifications/cancelled`` names, if one is in
        flight (closing its response stream is that revision's cancel); whether it was."""
        ident = _field(message.get("params"), "requestId")
        task = self.stateless.get(ident) if isinstance(ident, (str, int)) else None
        if task is None:
            return False
        task.cancel()
        return True

    def _start_request(self, message: dict[str, Any], headers: dict[str, str]) -> None:
        """Post a request in its own task (answered in its own time); a 2026-07-28 one is
        kept by its id for a later cancel."""
        task = asyncio.create_task(self._post(message, headers))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        ident = message["id"]
        if "mcp-method" in headers and isinstance(ident, (str, int)):
            self.stateless[ident] = task
            task.add_done_callback(lambda _t: self.stateless.pop(ident, None))

    async def _post(self, message: Any, headers: dict[str, str]) -> None:
        ident = _field(message, "id")
        # a request is answered, even one whose id the daemon refuses (then "id": null)
        request = isinstance(message, dict) and "method" in message and "id" in message
        try:
            async with self.http.stream("POST", self.endpoint, headers=headers,
                                        content=json.dumps(message).encode()) as response:
                if _field(message, "method") == "initialize":
                    self.session_id = response.headers.get("mcp-session-id", self.session_id)
                await self._answer(response, message, request, ident)
        except httpx.HTTPError as exc:
            if request:
                _write(_error(ident, f"cannot reach the daemon at {self.endpoint}: {exc}"))
            else:
                say(f"cannot reach the daemon at {self.endpoint}: {exc}")

    async def _answer(self, response: httpx.Response, message: Any, request: bool,
                      ident: Any) -> None:
        kind = response.headers.get("content-type", "")
        if kind.startswith("text/event-stream"):
            async for data in _events(response):
                self._deliver(data, message)
        else:
            await self._answer_whole(response, kind, message, request, ident)

    async def _answer_whole(self, response: httpx.Response, kind: str, message: Any,
                            request: bool, ident: Any) -> None:
        """A response that is one body: a JSON-RPC answer for the host, or a refusal."""
        body = await response.aread()
        text = body.decode("utf-8", errors="replace")
        if not request:  # a notification or an answer: the host expects nothing back
            if response.status_code >= 400:
                say(f"the daemon refused a message (HTTP {response.status_code}): {text[:300]}")
        elif kind.startswith("application/json") and body:
            self._deliver(text, message)
        elif response.status_code >= 400:  # an HTTP answer that is not JSON-RPC (a problem)
            _write(_error(ident, f"the daemon answered HTTP {response.status_code}: "
                                 f"{text[:300]}"))

    def _deliver(self, data: str, message: Any) -> None:
        try:
            answer = json.loads(data)
        except ValueError:
            say(f"from the daemon: not JSON: {data[:200]}")
            return
        if (_field(message, "method") == "initialize"
                and isinstance(_field(answer, "result"), dict)):
            version = answer["result"].get("protocolVersion")
            self.version = version if isinstance(version, str) else None
        _write(answer)

    async def _listen(self) -> None:
        """The handshake era's standalone stream: the daemon's notifications, for as long as
        the session lives (reopened if it drops)."""
        while self.session_id is not None:
            headers = _session_headers(self.session_id, self.version,
                                       {"accept": "text/event-stream"})
            try:
                async with self.http.stream("GET", self.endpoint, headers=headers) as response:
                    if response.status_code != 200:
                        return  # not offered, or the session is gone
                    async for data in _events(response):
                        self._deliver(data, None)
            except httpx.HTTPError as exc:
                say(f"the notification stream dropped: {exc}")
            await asyncio.sleep(1.0)

    async def close(self) -> None:
        """Stop every exchange and end the MCP session (the daemon deletes its workspace)."""
        running = [*self.tasks, *([self.listener] if self.listener else [])]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        if self.session_id is not None:
            headers = _session_headers(self.session_id, self.version, {})
            with contextlib.suppress(httpx.HTTPError):
                await self.http.delete(self.endpoint, headers=headers, timeout=DELETE_TIMEOUT_S)


def _posted_apart(message: dict[str, Any]) -> bool:
    """Whether a host message is a request answered in its own task: any but ``initialize``,
    which goes in order (the session id it brings goes on every later message)."""
    method = message.get("method")
    return isinstance(method, str) and "id" in message and method != "initialize"


def _error(ident: Any, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32603, "message": message}}


async def _host_lines() -> AsyncIterator[bytes]:
    """The host's lines on fd 0, read by the event loop (no thread: the end of the bridge
    never waits for a blocked ``read``)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    except (ValueError, OSError):  # a regular file: the loop cannot watch it; read it whole
        reader.feed_data(sys.stdin.buffer.read())
        reader.feed_eof()
    while True:
        try:
            line = await reader.readline()
        except (asyncio.LimitOverrunError, ValueError):
            say(f"from the host: a line over {LINE_LIMIT} bytes, dropped")
            continue
        if not line:
            return
        yield line


async def _pump(bridge: Bridge) -> None:
    async for line in _host_lines():
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError as exc:
            say(f"from the host: not JSON ({exc}), dropped")
            continue
        await bridge.from_host(message)


async def preflight(http: httpx.AsyncClient, endpoint: str) -> str | None:
    """A clear line for the host's log when the daemon is unreachable or refuses the token
    (otherwise the host only sees its first request fail)."""
    base = endpoint[: -len("/mcp")]
    try:
        response = await http.get(f"{base}/v1/tools")
    except httpx.HTTPError as exc:
        return f"cannot reach the daemon at {base}: {exc}"
    if response.status_code == 401:
        return (f"the daemon at {base} refused the token (HTTP 401): give the token of a "
                "client (`sandboxd token add NAME`) with --token-file")
    if response.status_code >= 400:
        return f"the daemon at {base} answered HTTP {response.status_code}: {response.text[:200]}"
    return None


async def run(endpoint: str, uds: str | None, token: str | None) -> int:
    """Pump until stdin ends or SIGTERM/SIGINT, then end the session; the exit code."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx.AsyncHTTPTransport(uds=uds) if uds else None
    # no read timeout: a call's notification stream may be quiet for as long as its deadline
    timeout = httpx.Timeout(30.0, read=None)
    async with httpx.AsyncClient(headers=headers, timeout=timeout, transport=transport) as http:
        problem = await preflight(http, endpoint)
        if problem is not None:
            say(problem)
            return EXIT_AUTH if "401" in problem else 1
        await _pump_until_stopped(Bridge(http, endpoint))
    return 0


async def _pump_until_stopped(bridge: Bridge) -> None:
    """Pump the host's lines until stdin ends or SIGTERM/SIGINT, then end the session."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):  # as if stdin closed: DELETE, exit
        loop.add_signal_handler(signum, stop.set)
    pump = asyncio.create_task(_pump(bridge))
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({pump, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if pump.done():
            pump.result()  # the end of stdin, or a bug: raised
    finally:
        await stop_task(pump)
        await stop_task(stopped)
        await bridge.close()
