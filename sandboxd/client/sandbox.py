"""``SandboxClient`` / ``AsyncSandboxClient``: the daemon's HTTP API as typed Python calls.

Both talk to the daemon over loopback TCP (``url``) or a unix socket (``socket``), send the
bearer token, raise :mod:`sandboxd.client.errors` exceptions for problem+json answers, and
retry a call that was rate limited (429) after the ``Retry-After`` the daemon asked for
(exponential backoff with jitter when it gave none), at most ``retries`` times. A call that
could not connect at all is retried the same way (nothing was sent, so it is safe).

A policy denial is not an exception: it is a :class:`~sandboxd.models.Result` with
``status == "denied"`` and a ``message`` saying why.
"""

from __future__ import annotations

import asyncio
import copy
import email.utils
import os
import random
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime
from typing import Any, BinaryIO, Literal, TypeVar, overload
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from sandboxd.client import files
from sandboxd.client.errors import ConnectionFailed, ProblemError, RateLimited, problem_error
from sandboxd.client.events import StreamItem, aiter_stream, iter_stream
from sandboxd.client.files import Body
from sandboxd.client.session import AsyncSession, Session, SessionInfo
from sandboxd.models import LimitsRequest, Result, ToolSpec

DEFAULT_URL = "http://127.0.0.1:8765"
M = TypeVar("M", bound=BaseModel)
USER_AGENT = "sandboxd-client/0.1"


def _lenient(model: type[M], data: Any) -> M:
    """Validate ``data`` as ``model``, ignoring members a newer daemon may have added.

    The shared models forbid unknown members (right for the daemon's own input); a client
    should still read the answers of a newer daemon, so only ``extra_forbidden`` errors are
    forgiven, by dropping those members; any other mismatch still raises.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        if not errors or any(e["type"] != "extra_forbidden" for e in errors):
            raise
        data = copy.deepcopy(data)
        for error in errors:
            node: Any = data
            *parents, last = error["loc"]
            for key in parents:
                node = node[key]
            if isinstance(node, dict):
                node.pop(last, None)
        return model.model_validate(data)


def _seg(value: str) -> str:
    """One URL path segment: a name can never reach another route (``../``, ``?``, ``#``)."""
    return quote(str(value), safe="")


def _retry_after_seconds(value: str | None) -> float | None:
    """Parse a Retry-After header: delta-seconds or an HTTP-date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when: datetime = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _limits_json(limits: LimitsRequest | dict[str, Any] | None) -> dict[str, Any] | None:
    if limits is None:
        return None
    if isinstance(limits, LimitsRequest):
        return limits.model_dump(exclude_none=True)
    return LimitsRequest.model_validate(limits).model_dump(exclude_none=True)


def _invoke_body(arguments: dict[str, Any] | None, kwargs: dict[str, Any], session: str | None,
                 limits: LimitsRequest | dict[str, Any] | None) -> dict[str, Any]:
    args = dict(arguments or {})
    args.update(kwargs)
    return {"arguments": args, "session": session, "limits": _limits_json(limits)}


class _Base:
    """Configuration and response handling shared by the sync and async clients."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        socket: str | os.PathLike[str] | None = None,
        timeout: float = 330.0,
        retries: int = 3,
        max_retry_wait: float = 30.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        if url is None and socket is None:
            url = os.environ.get("SANDBOXD_URL") or None
            sock_env = os.environ.get("SANDBOXD_SOCKET")
            socket = sock_env or None
        if token is None:
            token = os.environ.get("SANDBOXD_TOKEN") or None
        self.socket = os.fspath(socket) if socket is not None else None
        # over a unix socket the host part is only used for the Host header
        self.url = (url or ("http://sandboxd" if self.socket else DEFAULT_URL)).rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retries = max(0, retries)
        self.max_retry_wait = max_retry_wait
        self._headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def _client_kwargs(self) -> dict[str, Any]:
        return {"base_url": self.url, "headers": self._headers, "timeout": self.timeout}

    def _backoff(self, attempt: int, hint: float | None) -> float:
        if hint is not None:
            return min(hint, self.max_retry_wait)
        return min(self.max_retry_wait, 0.25 * 2**attempt) * (0.5 + random.random() / 2)

    @staticmethod
    def _error(response: httpx.Response) -> ProblemError:
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        retry_after = _retry_after_seconds(response.headers.get("Retry-After"))
        return problem_error(response.status_code, body, retry_after)

    def _transport_retry_wait(self, exc: httpx.TransportError, attempt: int) -> float:
        """Seconds to wait before retrying a request that failed in transport; raises
        :class:`ConnectionFailed` when it must not be retried (only refused connections are)."""
        if isinstance(exc, httpx.ConnectError):
            wait = self._should_retry(attempt, None)
            if wait is not None:
                return wait
            raise ConnectionFailed(
                f"cannot reach sandboxd at {self.socket or self.url}: {exc}") from exc
        if isinstance(exc, httpx.TimeoutException):
            raise ConnectionFailed(f"sandboxd did not answer in time: {exc}") from exc
        raise ConnectionFailed(f"connection to sandboxd failed: {exc}") from exc

    def _should_retry(self, attempt: int, response: httpx.Response | None) -> float | None:
        """Seconds to wait before another attempt, or None to stop."""
        if attempt >= self.retries:
            return None
        if response is None:  # could not connect
            return self._backoff(attempt, None)
        if response.status_code == 429:
            return self._backoff(attempt, _retry_after_seconds(response.headers.get("Retry-After")))
        if response.status_code == 503 and response.headers.get("Retry-After"):
            return self._backoff(attempt, _retry_after_seconds(response.headers.get("Retry-After")))
        return None

    def _check(self, response: httpx.Response) -> httpx.Response:
        if response.status_code >= 400:
            raise self._error(response)
        return response


class SandboxClient(_Base):
    """Synchronous client of a sandboxd daemon.

    ``SandboxClient()`` reads ``SANDBOXD_URL`` / ``SANDBOXD_SOCKET`` / ``SANDBOXD_TOKEN`` and
    defaults to ``http://127.0.0.1:8765``. Use it as a context manager or call :meth:`close`.
    """

    def __init__(self, url: str | None = None, *, transport: httpx.BaseTransport | None = None,
                 **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        if transport is None and self.socket:
            transport = httpx.HTTPTransport(uds=self.socket)
        self._transport = transport
        self._http = httpx.Client(transport=transport, **self._client_kwargs())

    # -- plumbing
    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def to_async(self) -> AsyncSandboxClient:
        """An :class:`AsyncSandboxClient` with the same address, token and retry settings."""
        return AsyncSandboxClient(
            self.url, token=self.token, socket=self.socket, timeout=self.timeout,
            retries=self.retries, max_retry_wait=self.max_retry_wait,
            headers={k: v for k, v in self._headers.items() if k != "Authorization"},
        )

    def request(self, method: str, path: str, *, json: Any = None,
                params: dict[str, Any] | None = None,
                timeout: float | None = None, content: Body | None = None,
                headers: dict[str, str] | None = None) -> httpx.Response:
        """Send one request with retries; raise a typed error for a 4xx/5xx answer."""
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    method, path, json=json, params=params, headers=headers,
                    content=content() if callable(content) else content,  # type: ignore[arg-type]
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.TransportError as exc:
                wait = self._transport_retry_wait(exc, attempt)
            else:
                wait = self._should_retry(attempt, response)
                if wait is None:
                    return self._check(response)
            time.sleep(wait)
            attempt += 1

    # -- API
    def health(self) -> bool:
        """True when ``/healthz`` answers 200."""
        try:
            return self._http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def ready(self) -> dict[str, Any]:
        """The ``/readyz`` report (raises :class:`Unavailable` when not ready)."""
        return self.request("GET", "/readyz").json()

    @overload
    def tools(self, format: Literal["spec"] = "spec") -> list[ToolSpec]: ...
    @overload
    def tools(self, format: Literal["openai"]) -> list[dict[str, Any]]: ...
    def tools(self, format: str = "spec") -> list[ToolSpec] | list[dict[str, Any]]:
        """The tools this client may call; ``format="openai"`` gives the OpenAI ``tools`` list."""
        if format == "openai":
            return self.request("GET", "/v1/tools", params={"format": "openai"}).json()
        return [_lenient(ToolSpec, t) for t in self.request("GET", "/v1/tools").json()]

    def invoke(self, tool: str, /, arguments: dict[str, Any] | None = None, *,
               session: str | None = None, limits: LimitsRequest | dict[str, Any] | None = None,
               **kwargs: Any) -> Result:
        """Run ``tool`` with ``arguments`` (a dict and/or keyword arguments); return its Result.

        Tool arguments named ``arguments``, ``session`` or ``limits`` must go in the dict.
        """
        body = _invoke_body(arguments, kwargs, session, limits)
        response = self.request("POST", f"/v1/tools/{_seg(tool)}/invoke", json=body)
        return _lenient(Result, response.json())

    def invoke_stream(self, tool: str, /, arguments: dict[str, Any] | None = None, *,
                      session: str | None = None,
                      limits: LimitsRequest | dict[str, Any] | None = None,
                      **kwargs: Any) -> Iterator[StreamItem]:
        """Like :meth:`invoke`, but yield the call's output as it is produced
        (:class:`ToolOutput`: stdout/stderr text, display items), then its :class:`Result`.
        Closing the iterator early disconnects, which cancels the call."""
        body = _invoke_body(arguments, kwargs, session, limits)
        return iter_stream(self._http, f"/v1/tools/{_seg(tool)}/invoke", body)

    def explain(self, tool: str, arguments: dict[str, Any] | None = None, *,
                limits: LimitsRequest | dict[str, Any] | None = None) -> dict[str, Any]:
        """What the policy would decide for this call, without running anything."""
        body: dict[str, Any] = {"tool": tool, "arguments": arguments or {}}
        if limits is not None:
            body["limits"] = _limits_json(limits)
        return self.request("POST", "/v1/policy/explain", json=body).json()

    # sessions
    def create_session(self, ttl_s: float | None = None) -> SessionInfo:
        """Create a session (a workspace that outlives single calls)."""
        body = {"ttl_s": ttl_s} if ttl_s is not None else {}
        return SessionInfo.from_json(self.request("POST", "/v1/sessions", json=body).json())

    def get_session(self, session_id: str) -> SessionInfo:
        """Describe one of this client's sessions."""
        return SessionInfo.from_json(self.request("GET", f"/v1/sessions/{_seg(session_id)}").json())

    def delete_session(self, session_id: str) -> None:
        """Delete a session and its workspace."""
        self.request("DELETE", f"/v1/sessions/{_seg(session_id)}")

    def sessions(self) -> list[SessionInfo]:
        """This client's sessions (oldest first), with usage and kernel state."""
        return [SessionInfo.from_json(d) for d in self.request("GET", "/v1/sessions").json()]

    def restart_session(self, session_id: str) -> SessionInfo:
        """End the session's Python kernel (its variables); files stay."""
        return SessionInfo.from_json(
            self.request("POST", f"/v1/sessions/{_seg(session_id)}/restart").json())

    @contextmanager
    def session(self, ttl_s: float | None = None) -> Iterator[Session]:
        """``with client.session() as s: s.invoke(...)`` — deleted on exit."""
        info = self.create_session(ttl_s)
        s = Session(self, info)
        try:
            yield s
        finally:
            s.close()

    # file helpers (meaningful with a session; without one each call has a fresh workspace)
    @overload
    def read_file(self, path: str, *, session: str | None = None,
                  encoding: Literal["utf-8"] = "utf-8") -> str: ...
    @overload
    def read_file(self, path: str, *, session: str | None = None,
                  encoding: Literal["base64"]) -> bytes: ...
    def read_file(self, path: str, *, session: str | None = None,
                  encoding: str = "utf-8") -> str | bytes:
        """Content of a workspace file: text, or its bytes with ``encoding="base64"``
        (raises :class:`ToolFailed` when it cannot be read)."""
        result = self.invoke("read_file", files.read_arguments(path, encoding), session=session)
        return files.decoded(_ensure_ok(result)) if encoding == "base64" else _file_text(result)

    def write_file(self, path: str, content: str | bytes, *,
                   session: str | None = None) -> Result:
        """Create or replace a workspace file (``bytes`` are sent base64-encoded)."""
        return _ensure_ok(self.invoke("write_file", files.write_arguments(path, content),
                                      session=session))

    def upload(self, session: str, path: str, data: bytes | BinaryIO) -> Result:
        """Create or replace a workspace file with raw bytes or a binary file's content
        (``PUT /v1/sessions/{session}/files/{path}``, streamed)."""
        content, headers = files.upload_body(data)
        response = self.request("PUT", files.file_url(session, path), content=content,
                                headers=headers)
        return _lenient(Result, response.json())

    def download(self, session: str, path: str) -> bytes:
        """The raw bytes of a workspace file (``GET /v1/sessions/{session}/files/{path}``)."""
        return self.request("GET", files.file_url(session, path)).content

    def list_files(self, path: str = ".", *, session: str | None = None) -> Any:
        """The entries of a workspace directory, as the daemon returns them."""
        result = _ensure_ok(self.invoke("list_files", {"path": path}, session=session))
        return result.value if result.value is not None else result.stdout


class ToolFailed(ProblemError):
    """A file helper's call ran but did not succeed (``result`` holds the details)."""

    def __init__(self, result: Result) -> None:
        super().__init__(200, title=f"{result.tool} {result.status}",
                         detail=result.message or result.stderr.strip() or str(result.status))
        self.result = result


def _ensure_ok(result: Result) -> Result:
    if result.status != "ok":
        raise ToolFailed(result)
    return result


def _file_text(result: Result) -> str:
    result = _ensure_ok(result)
    if isinstance(result.value, str):
        return result.value
    if isinstance(result.value, dict) and isinstance(result.value.get("content"), str):
        return result.value["content"]
    return result.stdout


class AsyncSandboxClient(_Base):
    """Asynchronous twin of :class:`SandboxClient` (same arguments, awaitable methods).

    Cancelling an awaiting call closes its HTTP request, which makes the daemon cancel the
    execution and clean up.
    """

    def __init__(self, url: str | None = None, *,
                 transport: httpx.AsyncBaseTransport | None = None, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        if transport is None and self.socket:
            transport = httpx.AsyncHTTPTransport(uds=self.socket)
        self._http = httpx.AsyncClient(transport=transport, **self._client_kwargs())

    async def __aenter__(self) -> AsyncSandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def request(self, method: str, path: str, *, json: Any = None,
                      params: dict[str, Any] | None = None,
                      timeout: float | None = None, content: Body | None = None,
                      headers: dict[str, str] | None = None) -> httpx.Response:
        """Send one request with retries; raise a typed error for a 4xx/5xx answer."""
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    method, path, json=json, params=params, headers=headers,
                    content=content() if callable(content) else content,  # type: ignore[arg-type]
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.TransportError as exc:
                wait = self._transport_retry_wait(exc, attempt)
            else:
                wait = self._should_retry(attempt, response)
                if wait is None:
                    return self._check(response)
            await asyncio.sleep(wait)
            attempt += 1

    async def health(self) -> bool:
        try:
            return (await self._http.get("/healthz")).status_code == 200
        except httpx.HTTPError:
            return False

    async def ready(self) -> dict[str, Any]:
        return (await self.request("GET", "/readyz")).json()

    async def tools(self, format: str = "spec") -> list[Any]:
        """See :meth:`SandboxClient.tools`."""
        if format == "openai":
            return (await self.request("GET", "/v1/tools", params={"format": "openai"})).json()
        return [_lenient(ToolSpec, t) for t in (await self.request("GET", "/v1/tools")).json()]

    async def invoke(self, tool: str, /, arguments: dict[str, Any] | None = None, *,
                     session: str | None = None,
                     limits: LimitsRequest | dict[str, Any] | None = None,
                     timeout: float | None = None, **kwargs: Any) -> Result:
        """See :meth:`SandboxClient.invoke`. ``timeout`` bounds the HTTP wait (seconds)."""
        body = _invoke_body(arguments, kwargs, session, limits)
        response = await self.request("POST", f"/v1/tools/{_seg(tool)}/invoke", json=body,
                                      timeout=timeout)
        return _lenient(Result, response.json())

    def invoke_stream(self, tool: str, /, arguments: dict[str, Any] | None = None, *,
                      session: str | None = None,
                      limits: LimitsRequest | dict[str, Any] | None = None,
                      **kwargs: Any) -> AsyncIterator[StreamItem]:
        """See :meth:`SandboxClient.invoke_stream` (``async for``)."""
        body = _invoke_body(arguments, kwargs, session, limits)
        return aiter_stream(self._http, f"/v1/tools/{_seg(tool)}/invoke", body)

    async def explain(self, tool: str, arguments: dict[str, Any] | None = None, *,
                      limits: LimitsRequest | dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"tool": tool, "arguments": arguments or {}}
        if limits is not None:
            body["limits"] = _limits_json(limits)
        return (await self.request("POST", "/v1/policy/explain", json=body)).json()

    async def create_session(self, ttl_s: float | None = None) -> SessionInfo:
        body = {"ttl_s": ttl_s} if ttl_s is not None else {}
        return SessionInfo.from_json((await self.request("POST", "/v1/sessions", json=body)).json())

    async def get_session(self, session_id: str) -> SessionInfo:
        return SessionInfo.from_json(
            (await self.request("GET", f"/v1/sessions/{_seg(session_id)}")).json())

    async def delete_session(self, session_id: str) -> None:
        await self.request("DELETE", f"/v1/sessions/{_seg(session_id)}")

    async def sessions(self) -> list[SessionInfo]:
        """This client's sessions (oldest first), with usage and kernel state."""
        return [SessionInfo.from_json(d)
                for d in (await self.request("GET", "/v1/sessions")).json()]

    async def restart_session(self, session_id: str) -> SessionInfo:
        """End the session's Python kernel (its variables); files stay."""
        return SessionInfo.from_json(
            (await self.request("POST", f"/v1/sessions/{_seg(session_id)}/restart")).json())

    @asynccontextmanager
    async def session(self, ttl_s: float | None = None):  # type: ignore[no-untyped-def]
        """``async with client.session() as s: await s.invoke(...)``."""
        info = await self.create_session(ttl_s)
        s = AsyncSession(self, info)
        try:
            yield s
        finally:
            await s.close()

    async def read_file(self, path: str, *, session: str | None = None,
                        encoding: str = "utf-8") -> str | bytes:
        """See :meth:`SandboxClient.read_file`."""
        result = await self.invoke("read_file", files.read_arguments(path, encoding),
                                   session=session)
        return files.decoded(_ensure_ok(result)) if encoding == "base64" else _file_text(result)

    async def write_file(self, path: str, content: str | bytes, *,
                         session: str | None = None) -> Result:
        return _ensure_ok(await self.invoke("write_file", files.write_arguments(path, content),
                                            session=session))

    async def upload(self, session: str, path: str, data: bytes | BinaryIO) -> Result:
        """See :meth:`SandboxClient.upload`."""
        content, headers = files.upload_body(data, asynchronous=True)
        response = await self.request("PUT", files.file_url(session, path), content=content,
                                      headers=headers)
        return _lenient(Result, response.json())

    async def download(self, session: str, path: str) -> bytes:
        """See :meth:`SandboxClient.download`."""
        return (await self.request("GET", files.file_url(session, path))).content

    async def list_files(self, path: str = ".", *, session: str | None = None) -> Any:
        result = _ensure_ok(await self.invoke("list_files", {"path": path}, session=session))
        return result.value if result.value is not None else result.stdout


__all__ = [
    "AsyncSandboxClient",
    "AsyncSession",
    "RateLimited",
    "SandboxClient",
    "Session",
    "SessionInfo",
    "ToolFailed",
]
