"""Who is calling: bearer tokens when a tokens file is configured, else the client ``local``.

Unknown or missing tokens get 401 problem+json, and 429 with ``Retry-After`` once the peer has
failed too often (:class:`~sandboxd.access.ratelimit.FailedAuthGuard`); they are audited as one
``auth_failure`` record per peer per interval (the token itself is never logged, only a short
digest prefix). Each token holder is rate limited (at most ``rate_limit_per_minute`` calls in
any 60 s); the tokenless loopback client is not.

With tokens configured, ``/metrics``, ``/readyz`` and the API docs need a token too unless the
``open_endpoints`` setting opens them; ``/healthz`` is always open.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, NoReturn

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from sandboxd.access.ratelimit import peer_key
from sandboxd.access.tokens import TokenStore
from sandboxd.api.problems import Problem

LOCAL_CLIENT = "local"


async def authenticate(request: Request) -> str:
    """FastAPI dependency: the client name of the caller (or a 401/429 problem). Without a
    tokens file the caller is the local client and nothing is read or counted: answered here,
    without the thread hop of a sync dependency on every request (its
    CPU on every call); with one, the
    check (which may re-read the file and audit failures) runs in a worker thread."""
    if request.app.state.tokens is None:
        return LOCAL_CLIENT
    return await run_in_threadpool(authenticate_now, request)


def authenticate_now(request: Request) -> str:
    """:func:`authenticate`, blocking (the caller is in a worker thread)."""
    state = request.app.state
    if state.tokens is None:
        # the tokenless client exists only on loopback or a unix socket: the host's own
        # agent, which the scheduler's queue bounds already; rate limits are for token holders
        return LOCAL_CLIENT
    client = _token_client(request, state.tokens)
    _rate_limit(state, client)
    return client


def _token_client(request: Request, tokens: TokenStore) -> str:
    """The client of the request's bearer token (a 401 when there is none, or it is unknown
    or expired: :func:`_failed`)."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    entry = tokens.entry_for(token) if scheme.lower() == "bearer" and token else None
    if entry is None:
        _failed(request, token, "missing bearer token" if not token else "unknown token")
    if entry.expired():
        _failed(request, token, f"expired token (id {entry.id}, expired {entry.expires})")
    return entry.client


def _rate_limit(state: Any, client: str) -> None:
    """A 429 when ``client`` is over its rate limit (when one is set)."""
    limiter = state.rate_limiter
    if limiter is None:
        return
    wait = limiter.check(client)
    if wait is not None:
        state.service.metrics.rejections.labels(reason="rate_limit").inc()
        seconds = max(1, int(wait + 0.999))
        raise Problem(429, "rate-limited", "Rate limit exceeded",
                      f"client '{client}' made {limiter.per_minute} calls in the last 60 s, "
                      "its rate limit (setting rate_limit_per_minute); retry in "
                      f"{seconds} s", headers={"Retry-After": str(seconds)},
                      retry_after=seconds, limit="rate_limit_per_minute",
                      limit_value=limiter.per_minute)


def _failed(request: Request, token: str, reason: str) -> NoReturn:
    """Count a failed authentication and raise its 401, or 429 when the peer failed too often."""
    state = request.app.state
    state.service.metrics.auth_failures.inc()
    peer = peer_key(request.client.host if request.client else None)
    digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:12] \
        if token else None
    wait = state.failed_auth.failure(peer, reason=reason, path=request.url.path, digest=digest)
    if wait is not None:
        state.service.metrics.rejections.labels(reason="auth_failures").inc()
        seconds = max(1, int(wait + 0.999))
        raise Problem(429, "auth-rate-limited", "Too many failed authentications",
                      f"{reason}, and too many failed authentications from {peer}; retry in "
                      f"{seconds} s with a valid token",
                      headers={"Retry-After": str(seconds), "WWW-Authenticate": "Bearer"},
                      retry_after=seconds)
    raise Problem(401, "unauthorized", "Unauthorized",
                  f"{reason}: send 'Authorization: Bearer <token>' with a token the "
                  "administrator created with `sandboxd token add`",
                  headers={"WWW-Authenticate": "Bearer"})


def guard(endpoint: str) -> Callable[[Request], None]:
    """A dependency for an operational endpoint (``metrics``, ``readyz``, ``docs``): it needs
    a token like the API unless the ``open_endpoints`` setting names it."""

    def check(request: Request) -> None:
        state = request.app.state
        if state.tokens is not None and endpoint not in state.service.settings.open_endpoints:
            authenticate_now(request)

    return check
