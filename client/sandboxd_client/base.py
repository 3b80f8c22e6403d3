"""What the sync and async clients share: configuration (address, token, retries), response
and retry handling, request bodies, and :class:`ToolFailed` for the file helpers.

Retries. A rate-limited (429) or overloaded (503 with ``Retry-After``) answer raises
:class:`RateLimited` / :class:`Unavailable` at once by default, with the daemon's
``retry_after``: an agent loop decides what to do (a silent wait of up to a minute looks like
a hang to it). ``retries=N`` retries such an answer at most N times, each after the daemon's
``Retry-After`` (capped by ``max_retry_wait``; jittered exponential backoff without one), and
calls ``on_retry(error, attempt, wait)`` before each wait. A connection that was refused is
retried ``connect_retries`` times (nothing was sent, so it is safe); ``on_retry`` hears of
those too (the error: :class:`ConnectionFailed`).
"""

from __future__ import annotations

import copy
import os
import random
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from sandboxd_client import DEFAULT_URL
from sandboxd_client.errors import (
    ConnectionFailed,
    ProblemError,
    SandboxError,
    problem_error,
    retry_after_seconds,
)
from sandboxd_client.files import Body
from sandboxd_client.models import Result

M = TypeVar("M", bound=BaseModel)
#: the limits a call asks for: ``{"timeout_s": 5, "memory_bytes": 64 << 20}`` (the daemon
#: checks them: a value out of bounds is an :class:`InvalidArguments` naming it)
LimitsArg = Mapping[str, float] | BaseModel
#: called before each retry with the error that is retried, the attempt (1 for the first
#: retry) and the seconds it waits (:data:`ClientBase.on_retry`)
RetryHook = Callable[[SandboxError, int, float], object]
USER_AGENT = "sandboxd-client/0.1"


def lenient(model: type[M], data: Any) -> M:
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
            _drop_member(data, error["loc"])
        return model.model_validate(data)


def _drop_member(data: Any, loc: tuple[int | str, ...]) -> None:
    """Remove the member at ``loc`` (a validation error's location) from ``data``."""
    *parents, last = loc
    node = data
    for key in parents:
        node = node[key]
    if isinstance(node, dict):
        node.pop(last, None)


def path_segment(value: str) -> str:
    """One URL path segment: a name can never reach another route (``../``, ``?``, ``#``)."""
    return quote(str(value), safe="")


def invoke_url(tool: str, session: str | None = None) -> str:
    """The path of a tool's invoke endpoint; in a session, the session's own (a fleet's proxy
    routes it to the session's node by the path: docs/fleet.md)."""
    if session is not None:
        return f"{session_url(session)}/tools/{path_segment(tool)}/invoke"
    return f"/v1/tools/{path_segment(tool)}/invoke"


def session_url(session_id: str, action: str = "") -> str:
    """The path of a session (or of one of its actions, e.g. ``restart``)."""
    return f"/v1/sessions/{path_segment(session_id)}" + (f"/{action}" if action else "")


def limits_json(limits: LimitsArg | None) -> dict[str, Any] | None:
    """The ``limits`` member of a request body (unset ones left out)."""
    if limits is None:
        return None
    data = limits.model_dump() if isinstance(limits, BaseModel) else dict(limits)
    return {name: value for name, value in data.items() if value is not None}


def invoke_body(arguments: dict[str, Any] | None, kwargs: dict[str, Any],
                 limits: LimitsArg | None) -> dict[str, Any]:
    """The body of an invoke; a session is named by the path (:func:`invoke_url`)."""
    args = dict(arguments or {})
    args.update(kwargs)
    return {"arguments": args, "limits": limits_json(limits)}


def _environment_defaults(url: str | None, socket: str | os.PathLike[str] | None,
                          token: str | None) -> tuple[str | None,
                                                      str | os.PathLike[str] | None, str | None]:
    """(url, socket, token) with ``SANDBOXD_URL``/``SANDBOXD_SOCKET`` when neither address is
    given and ``SANDBOXD_TOKEN`` when no token is (an empty variable counts as unset)."""
    if url is None and socket is None:
        url = os.environ.get("SANDBOXD_URL") or None
        socket = os.environ.get("SANDBOXD_SOCKET") or None
    if token is None:
        token = os.environ.get("SANDBOXD_TOKEN") or None
    return url, socket, token


class ClientBase:
    """Configuration and response handling shared by the sync and async clients."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        socket: str | os.PathLike[str] | None = None,
        timeout: float = 330.0,
        retries: int = 0,
        max_retry_wait: float = 30.0,
        on_retry: RetryHook | None = None,
        connect_retries: int = 3,
        headers: dict[str, str] | None = None,
    ) -> None:
        url, socket, token = _environment_defaults(url, socket, token)
        self.socket = os.fspath(socket) if socket is not None else None
        # over a unix socket the host part is only used for the Host header
        self.url = (url or ("http://sandboxd" if self.socket else DEFAULT_URL)).rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retries = max(0, retries)
        self.max_retry_wait = max_retry_wait
        self.on_retry = on_retry
        self.connect_retries = max(0, connect_retries)
        self._headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    @staticmethod
    def _request_kwargs(json: Any, params: dict[str, Any] | None, timeout: float | None,
                        content: Body | None, headers: dict[str, str] | None) -> dict[str, Any]:
        """httpx arguments of one attempt (a callable body is called again per attempt)."""
        return {"json": json, "params": params, "headers": headers,
                "content": content() if callable(content) else content,
                "timeout": timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT}

    def _client_kwargs(self) -> dict[str, Any]:
        return {"base_url": self.url, "headers": self._headers, "timeout": self.timeout}

    def _backoff(self, attempt: int, hint: float | None) -> float:
        if hint is not None:
            return min(hint, self.max_retry_wait)
        return min(self.max_retry_wait, 0.25 * 2.0**attempt) * (0.5 + random.random() / 2)

    @staticmethod
    def _error(response: httpx.Response) -> ProblemError:
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        retry_after = retry_after_seconds(response.headers.get("Retry-After"))
        return problem_error(response.status_code, body, retry_after)

    def _retry_wait(self, error: SandboxError, attempt: int, budget: int,
                    hint: float | None) -> float:
        """Seconds to wait before retry number ``attempt + 1`` of ``error`` (the hook is told),
        or ``error`` raised when ``budget`` retries are spent."""
        if attempt >= budget:
            raise error
        wait = self._backoff(attempt, hint)
        if self.on_retry is not None:
            self.on_retry(error, attempt + 1, wait)
        return wait

    def _transport_retry_wait(self, exc: httpx.TransportError, attempt: int) -> float:
        """Seconds to wait before retrying a request that failed in transport; raises
        :class:`ConnectionFailed` when it must not be retried (only refused connections are)."""
        if isinstance(exc, httpx.ConnectError):
            error = ConnectionFailed(f"cannot reach sandboxd at {self.socket or self.url}: {exc}")
            error.__cause__ = exc
            return self._retry_wait(error, attempt, self.connect_retries, None)
        if isinstance(exc, httpx.TimeoutException):
            raise ConnectionFailed(f"sandboxd did not answer in time: {exc}") from exc
        raise ConnectionFailed(f"connection to sandboxd failed: {exc}") from exc

    def _response_retry_wait(self, response: httpx.Response, attempt: int) -> float | None:
        """Seconds to wait before another attempt after an answer that may be retried (429,
        503 with ``Retry-After``), None for any other answer; the typed error raised when the
        retries are spent (``retries=0``: at once)."""
        if response.status_code == 429 or (response.status_code == 503
                                           and response.headers.get("Retry-After")):
            error = self._error(response)
            return self._retry_wait(error, attempt, self.retries, error.retry_after)
        return None

    def _check(self, response: httpx.Response) -> httpx.Response:
        if response.status_code >= 400:
            raise self._error(response)
        return response


class ToolFailed(ProblemError):
    """A file helper's call ran but did not succeed (``result`` holds the details)."""

    def __init__(self, result: Result) -> None:
        super().__init__(200, title=f"{result.tool} {result.status}",
                         detail=result.message or result.stderr.strip() or str(result.status))
        self.result = result


def ensure_ok(result: Result) -> Result:
    if result.status != "ok":
        raise ToolFailed(result)
    return result


def file_text(result: Result) -> str:
    result = ensure_ok(result)
    if isinstance(result.value, str):
        return result.value
    content = result.value.get("content") if isinstance(result.value, dict) else None
    if isinstance(content, str):
        return content
    return result.stdout
