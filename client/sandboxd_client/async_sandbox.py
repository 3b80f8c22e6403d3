"""``AsyncSandboxClient``: the asynchronous twin of :class:`~sandboxd_client.sandbox.SandboxClient`
(same arguments, awaitable methods)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, BinaryIO

import httpx

from sandboxd_client import files
from sandboxd_client.base import (
    ClientBase,
    LimitsArg,
    ensure_ok,
    file_text,
    invoke_body,
    invoke_url,
    lenient,
    limits_json,
    session_url,
)
from sandboxd_client.events import StreamItem, aiter_stream
from sandboxd_client.files import Body
from sandboxd_client.models import Result, ToolSpec
from sandboxd_client.session import AsyncSession, ForkInfo, SessionInfo


class AsyncSandboxClient(ClientBase):
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
        refused = answered = 0  # retries so far: of a refused connection, of an answer
        while True:
            try:
                response = await self._http.request(
                    method, path, **self._request_kwargs(json, params, timeout, content, headers))
            except httpx.TransportError as exc:
                wait = self._transport_retry_wait(exc, refused)
                refused += 1
            else:
                retry = self._response_retry_wait(response, answered)
                if retry is None:
                    return self._check(response)
                wait = retry
                answered += 1
            await asyncio.sleep(wait)

    async def health(self) -> bool:
        try:
            return (await self._http.get("/healthz")).status_code == 200
        except httpx.HTTPError:
            return False

    async def ready(self) -> dict[str, Any]:
        report: dict[str, Any] = (await self.request("GET", "/readyz")).json()
        return report

    async def tools(self, format: str = "spec") -> list[Any]:
        """See :meth:`SandboxClient.tools`."""
        if format == "openai":
            listed: list[Any] = (
                await self.request("GET", "/v1/tools", params={"format": "openai"})).json()
            return listed
        return [lenient(ToolSpec, t) for t in (await self.request("GET", "/v1/tools")).json()]

    async def invoke(self, tool: str, /, arguments: dict[str, Any] | None = None, *,
                     session: str | None = None,
                     limits: LimitsArg | None = None,
                     timeout: float | None = None, **kwargs: Any) -> Result:
        """See :meth:`SandboxClient.invoke`. ``timeout`` bounds the HTTP wait (seconds)."""
        body = invoke_body(arguments, kwargs, limits)
        response = await self.request("POST", invoke_url(tool, session), json=body,
                                      timeout=timeout)
        return lenient(Result, response.json())

    def invoke_stream(self, tool: str, /, arguments: dict[str, Any] | None = None, *,
                      session: str | None = None,
                      limits: LimitsArg | None = None,
                      **kwargs: Any) -> AsyncIterator[StreamItem]:
        """See :meth:`SandboxClient.invoke_stream` (``async for``)."""
        body = invoke_body(arguments, kwargs, limits)
        return aiter_stream(self._http, invoke_url(tool, session), body)

    async def explain(self, tool: str, arguments: dict[str, Any] | None = None, *,
                      limits: LimitsArg | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"tool": tool, "arguments": arguments or {}}
        if limits is not None:
            body["limits"] = limits_json(limits)
        explained: dict[str, Any] = (
            await self.request("POST", "/v1/policy/explain", json=body)).json()
        return explained

    async def create_session(self, ttl_s: float | None = None) -> SessionInfo:
        body = {"ttl_s": ttl_s} if ttl_s is not None else {}
        return SessionInfo.from_json((await self.request("POST", "/v1/sessions", json=body)).json())

    async def get_session(self, session_id: str) -> SessionInfo:
        return SessionInfo.from_json(
            (await self.request("GET", session_url(session_id))).json())

    async def delete_session(self, session_id: str) -> None:
        await self.request("DELETE", session_url(session_id))

    async def sessions(self) -> list[SessionInfo]:
        """This client's sessions (oldest first), with usage and kernel state."""
        return [SessionInfo.from_json(d)
                for d in (await self.request("GET", "/v1/sessions")).json()]

    async def fork_session(self, session_id: str, count: int = 1) -> ForkInfo:
        """See :meth:`SandboxClient.fork_session`."""
        return ForkInfo.from_json((await self.request(
            "POST", session_url(session_id, "fork"), json={"count": count})).json())

    async def capacity(self) -> dict[str, Any]:
        """See :meth:`SandboxClient.capacity`."""
        return dict((await self.request("GET", "/v1/capacity")).json())

    async def restart_session(self, session_id: str) -> SessionInfo:
        """End the session's Python kernel (its variables); files stay."""
        return SessionInfo.from_json(
            (await self.request("POST", session_url(session_id, "restart"))).json())

    async def interrupt_session(self, session_id: str) -> SessionInfo:
        """Interrupt the call running in the session now (``KeyboardInterrupt``)."""
        return SessionInfo.from_json(
            (await self.request("POST", session_url(session_id, "interrupt"))).json())

    async def attach(self, session_id: str) -> AsyncSession:
        """See :meth:`SandboxClient.attach` (an existing session by id, left open on close)."""
        return AsyncSession(self, await self.get_session(session_id), owned=False)

    @asynccontextmanager
    async def session(self, ttl_s: float | None = None) -> AsyncIterator[AsyncSession]:
        """``async with client.session() as s: await s.invoke(...)``."""
        info = await self.create_session(ttl_s)
        s = AsyncSession(self, info, owned=True)
        try:
            yield s
        finally:
            await s.close()

    async def read_file(self, path: str, *, session: str | None = None,
                        encoding: str = "utf-8") -> str | bytes:
        """See :meth:`SandboxClient.read_file`."""
        result = await self.invoke("read_file", files.read_arguments(path, encoding),
                                   session=session)
        return files.decoded(ensure_ok(result)) if encoding == "base64" else file_text(result)

    async def write_file(self, path: str, content: str | bytes, *,
                         session: str | None = None) -> Result:
        return ensure_ok(await self.invoke("write_file", files.write_arguments(path, content),
                                            session=session))

    async def upload(self, session: str, path: str, data: bytes | BinaryIO) -> Result:
        """See :meth:`SandboxClient.upload`."""
        content, headers = files.upload_body(data, asynchronous=True)
        response = await self.request("PUT", files.file_url(session, path), content=content,
                                      headers=headers)
        return lenient(Result, response.json())

    async def download(self, session: str, path: str) -> bytes:
        """See :meth:`SandboxClient.download`."""
        return (await self.request("GET", files.file_url(session, path))).content

    async def list_files(self, path: str = ".", *, session: str | None = None) -> Any:
        result = ensure_ok(await self.invoke("list_files", {"path": path}, session=session))
        return result.value if result.value is not None else result.stdout

