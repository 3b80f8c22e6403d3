"""Typed exceptions of the thin client. HTTP errors carry the daemon's RFC 9457 problem details."""

from __future__ import annotations

import email.utils
import time
from datetime import datetime
from typing import Any


class SandboxError(Exception):
    """Base class of every error raised by :mod:`sandboxd_client`."""


class ConnectionFailed(SandboxError):
    """The daemon could not be reached (connection refused, socket missing, timeout)."""


class ProblemError(SandboxError):
    """The daemon answered with an HTTP error; the fields mirror its problem+json body.

    ``extra`` holds every additional member of the problem object (for example ``field``).
    """

    def __init__(
        self,
        status: int,
        *,
        title: str = "",
        detail: str = "",
        type: str = "about:blank",
        extra: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.title = title
        self.detail = detail
        self.type = type
        self.extra = dict(extra or {})
        self.retry_after = retry_after
        text = detail or title or f"HTTP {status}"
        super().__init__(f"{status} {title}: {text}" if title and detail else f"{status} {text}")

    @property
    def problem(self) -> dict[str, Any]:
        """The problem object as the daemon sent it."""
        return {"type": self.type, "title": self.title, "status": self.status,
                "detail": self.detail, **self.extra}


class BadRequest(ProblemError):
    """400: the request was malformed."""


class AuthenticationError(ProblemError):
    """401: the bearer token is missing or unknown."""


class PermissionDenied(ProblemError):
    """403: the client may not do this (for example another client's session)."""


class NotFound(ProblemError):
    """404: unknown tool or session."""


class PayloadTooLarge(ProblemError):
    """413: the request body is over the daemon's cap."""


class InvalidArguments(ProblemError):
    """422: the arguments do not match the tool's schema; ``field`` names the culprit."""

    @property
    def field(self) -> str | None:
        value = self.extra.get("field")
        return str(value) if value is not None else None


class RateLimited(ProblemError):
    """429: too many calls or a full queue; ``retry_after`` is the daemon's hint in seconds."""


class Unavailable(ProblemError):
    """503: the daemon is draining or not ready."""


class ServerError(ProblemError):
    """Any other 5xx."""


_BY_STATUS: dict[int, type[ProblemError]] = {
    400: BadRequest,
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFound,
    413: PayloadTooLarge,
    422: InvalidArguments,
    429: RateLimited,
    503: Unavailable,
}


def problem_error(status: int, body: Any, retry_after: float | None = None) -> ProblemError:
    """Build the typed exception for an HTTP error status and its (decoded) body."""
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else ProblemError)
    return cls(status, **_problem_fields(body), retry_after=retry_after)


_PROBLEM_MEMBERS = ("type", "title", "status", "detail")


def _problem_fields(body: Any) -> dict[str, Any]:
    """The exception's fields from a problem document (RFC 9457; other members go to
    ``extra``), or the start of a body that is only text."""
    if not isinstance(body, dict):
        return {"detail": (body if isinstance(body, str) else "")[:500]}
    return {"title": str(body.get("title") or ""),
            "detail": str(body.get("detail") or ""),
            "type": str(body.get("type") or "about:blank"),
            "extra": {k: v for k, v in body.items() if k not in _PROBLEM_MEMBERS}}


def retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds (it says delta-seconds or an HTTP-date); None
    without one or for one that is neither."""
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
