"""Who is calling: bearer tokens when a tokens file is configured, else the client ``local``.

Unknown or missing tokens get 401 problem+json and an ``auth_failure`` audit record (the token
itself is never logged, only a short digest prefix). Each client is rate limited.
"""

from __future__ import annotations

import contextlib
import hashlib

from fastapi import Request

from sandboxd.api.problems import Problem

LOCAL_CLIENT = "local"


def authenticate(request: Request) -> str:
    """FastAPI dependency: the client name of the caller (or a 401/429 problem)."""
    state = request.app.state
    service = state.service
    tokens = state.tokens
    client = LOCAL_CLIENT
    if tokens is not None:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        found = tokens.client_for(token) if scheme.lower() == "bearer" and token else None
        if found is None:
            service.metrics.auth_failures.inc()
            reason = "missing bearer token" if not token else "unknown token"
            with contextlib.suppress(Exception):
                service.audit.write(
                    "auth_failure", reason=reason, path=request.url.path,
                    peer=request.client.host if request.client else None,
                    token_digest=hashlib.sha256(token.encode()).hexdigest()[:12] if token else None,
                )
            raise Problem(401, "unauthorized", "Unauthorized",
                          f"{reason}: send 'Authorization: Bearer <token>' with a token the "
                          "administrator created with `sandboxd token add`",
                          headers={"WWW-Authenticate": "Bearer"})
        client = found
    limiter = state.rate_limiter
    if limiter is not None:
        wait = limiter.check(client)
        if wait is not None:
            service.metrics.rejections.labels(reason="rate_limit").inc()
            seconds = max(1, int(wait + 0.999))
            raise Problem(429, "rate-limited", "Rate limit exceeded",
                          f"client '{client}' is over its rate limit; retry in {seconds} s",
                          headers={"Retry-After": str(seconds)}, retry_after=seconds)
    return client
