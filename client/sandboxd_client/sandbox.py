"""``SandboxClient``: the daemon's HTTP API as typed Python calls (its asynchronous twin,
``AsyncSandboxClient``, is in :mod:`sandboxd_client.async_sandbox`; what they share is in
:mod:`sandboxd_client.base`).

Both talk to the daemon over loopback TCP (``url``) or a unix socket (``socket``), send the
bearer token and raise :mod:`sandboxd_client.errors` exceptions for problem+json answers: a
rate-limited or overloaded call raises :class:`RateLimited` / :class:`Unavailable` with the
daemon's ``retry_after`` unless the caller asked for ``retries`` (:mod:`sandboxd_client.base`).

A policy denial is not an exception: it is a :class:`~sandboxd_client.models.Result` with
``status == "denied"`` and a ``message`` saying why.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO, Literal, overload

import httpx

from sandboxd_client import files
from sandboxd_client.async_sandbox import AsyncSandboxClient
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
from sandboxd_client.events import StreamItem, iter_stream
from sandboxd_client.files import Body
from sandboxd_client.models import Result, ToolSpec
from sandboxd_client.session import ForkInfo, Session, SessionInfo


class SandboxClient(ClientBase):
    """Synchronous client of a sandboxd daemon.

    ``SandboxClient()`` reads ``SANDBOXD_URL`` / ``SANDBOXD_SOCKET`` / ``SANDBOXD_TOKEN`` and
    defaults to ``http://127.0.0.1:8765``. Use it as a context manager or call :meth:`close`.
    ``retries``, ``max_retry_wait``, ``on_retry``, ``connect_retries``: what is retried and
    how (:mod:`sandboxd_client.base`; by default a 429 or 503 is raised at once).
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
            retries=self.retries, max_retry_wait=self.max_retry_wait, on_retry=self.on_retry,
            connect_retries=self.connect_retries,
            headers={k: v for k, v in self._headers.items() if k != "Authorization"},
        )

    def request(self, method: str, path: str, *, json: Any = None,
                params: dict[str, Any] | None = None,
                timeout: float | None = None, content: Body | None = None,
                headers: dict[str, str] | None = None) -> httpx.Response:
        """Send one request with retries; raise a typed error for a 4xx/5xx answer."""
        refused = answered = 0  # retries so far: of a refused connection, of an answer
        while True:
            try:
                response = self._http.request(
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
            time.sleep(wait)

    # -- API
    def health(self) -> bool:
        """True when ``/healthz`` answers 200."""
        try:
            return self._http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def ready(self) -> dict[str, Any]:
        """The ``/readyz`` report (raises :class:`Unavailable` when not ready)."""
        report: dict[str, Any] = self.request("GET", "/readyz").json()
        return report

    @overload
    def tools(self, format: Literal["spec"] = "spec") -> list[ToolSpec]: ...
    @overload
    def tools(self, format: Literal["openai"]) -> list[dict[str, Any]]: ...
    def tools(self, format: str = "spec") -> list[ToolSpec] | list[dict[str, Any]]:
        """The tools this client may call; ``format="openai"`` gives the OpenAI ``tools`` list."""
        if format == "openai":
            listed: list[dict[str, Any]] = self.request(
                "GET", "/v1/tools", params={"format": "openai"}).json()
            return listed
        return [lenient(ToolSpec, t) for t in self.request("GET", "/v1/tools").json()]

    def invoke(self, tool: str, /, arguments: dict[str, Any] | None = None, *,
               session: str | None = None, limits: LimitsArg | None = None,
               **kwargs: Any) -> Result:
        """Run ``tool`` with ``arguments`` (a dict and/or keyword arguments); return its Result.

        Tool arguments named ``arguments``, ``session`` or ``limits`` must go in the dict.
        """
        body = invoke_body(arguments, kwargs, limits)
        response = self.request("POST", invoke_url(tool, session), json=body)
        return lenient(Result, response.json())

    def invoke_stream(self, tool: str, /, arguments: dict[str, Any] | None = None, *,
                      session: str | None = None,
                      limits: LimitsArg | None = None,
                      **kwargs: Any) -> Iterator[StreamItem]:
        """Like :meth:`invoke`, but yield the call's output as it is produced
        (:class:`ToolOutput`: stdout/stderr text, display items), then its :class:`Result`.
        Closing the iterator early disconnects, which cancels the call."""
        body = invoke_body(arguments, kwargs, limits)
        return iter_stream(self._http, invoke_url(tool, session), body)

    def explain(self, tool: str, arguments: dict[str, Any] | None = None, *,
                limits: LimitsArg | None = None) -> dict[str, Any]:
        """What the policy would decide for this call, without running anything."""
        body: dict[str, Any] = {"tool": tool, "arguments": arguments or {}}
        if limits is not None:
            body["limits"] = limits_json(limits)
        explained: dict[str, Any] = self.request("POST", "/v1/policy/explain", json=body).json()
        return explained

    # sessions
    def create_session(self, ttl_s: float | None = None) -> SessionInfo:
        """Create a session (a workspace that outlives single calls)."""
        body = {"ttl_s": ttl_s} if ttl_s is not None else {}
        return SessionInfo.from_json(self.request("POST", "/v1/sessions", json=body).json())

    def get_session(self, session_id: str) -> SessionInfo:
        """Describe one of this client's sessions."""
        return SessionInfo.from_json(self.request("GET", session_url(session_id)).json())

    def delete_session(self, session_id: str) -> None:
        """Delete a session and its workspace."""
        self.request("DELETE", session_url(session_id))

    def sessions(self) -> list[SessionInfo]:
        """This client's sessions (oldest first), with usage and kernel state."""
        return [SessionInfo.from_json(d) for d in self.request("GET", "/v1/sessions").json()]

    def fork_session(self, session_id: str, count: int = 1) -> ForkInfo:
        """``count`` forks of a session: new sessions with a copy of its files."""
        return ForkInfo.from_json(self.request(
            "POST", session_url(session_id, "fork"), json={"count": count}).json())

    def capacity(self) -> dict[str, Any]:
        """``GET /v1/capacity``: sessions, kernels, sandbox uids, memory headroom, ``full``."""
        return dict(self.request("GET", "/v1/capacity").json())

    def restart_session(self, session_id: str) -> SessionInfo:
        """End the session's Python kernel (its variables); files stay."""
        return SessionInfo.from_json(
            self.request("POST", session_url(session_id, "restart")).json())

    def interrupt_session(self, session_id: str) -> SessionInfo:
        """Interrupt the call running in the session now (``KeyboardInterrupt``)."""
        return SessionInfo.from_json(
            self.request("POST", session_url(session_id, "interrupt")).json())

    def attach(self, session_id: str) -> Session:
        """An existing session of this client's (made by another process, an earlier run, or
        ``sandboxd`` CLI), by its id: its calls share its workspace and Python variables.
        Closing it leaves the session to its owner (:meth:`Session.delete` deletes it); raises
        :class:`NotFound` when there is no such session (or it expired)."""
        return Session(self, self.get_session(session_id), owned=False)

    @contextmanager
    def session(self, ttl_s: float | None = None) -> Iterator[Session]:
        """``with client.session() as s: s.invoke(...)`` — deleted on exit."""
        info = self.create_session(ttl_s)
        s = Session(self, info, owned=True)
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
        return files.decoded(ensure_ok(result)) if encoding == "base64" else file_text(result)

    def write_file(self, path: str, content: str | bytes, *,
                   session: str | None = None) -> Result:
        """Create or replace a workspace file (``bytes`` are sent base64-encoded)."""
        return ensure_ok(self.invoke("write_file", files.write_arguments(path, content),
                                      session=session))

    def upload(self, session: str, path: str, data: bytes | BinaryIO) -> Result:
        """Create or replace a workspace file with raw bytes or a binary file's content
        (``PUT /v1/sessions/{session}/files/{path}``, streamed)."""
        content, headers = files.upload_body(data)
        response = self.request("PUT", files.file_url(session, path), content=content,
                                headers=headers)
        return lenient(Result, response.json())

    def download(self, session: str, path: str) -> bytes:
        """The raw bytes of a workspace file (``GET /v1/sessions/{session}/files/{path}``)."""
        return self.request("GET", files.file_url(session, path)).content

    def list_files(self, path: str = ".", *, session: str | None = None) -> Any:
        """The entries of a workspace directory, as the daemon returns them."""
        result = ensure_ok(self.invoke("list_files", {"path": path}, session=session))
        return result.value if result.value is not None else result.stdout
