"""The FastAPI application factory and its lifespan (start/stop the :class:`Sandboxd` service)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandboxd import __version__
from sandboxd.access.ratelimit import FailedAuthGuard
from sandboxd.api import approvals, contract, e2b, files, problems, revocation
from sandboxd.api.auth import guard
from sandboxd.api.browser_guard import BrowserGuard
from sandboxd.api.closing import CloseWhileDraining
from sandboxd.api.mcp.door import LazyMcpDoor
from sandboxd.api.routes import router
from sandboxd.backends.registry import default_backend
from sandboxd.config import Settings
from sandboxd.errors import SandboxdError
from sandboxd.health.readiness import backend_failure
from sandboxd.service import Sandboxd
from sandboxd.util.deadline import stop_task

if TYPE_CHECKING:
    from sandboxd.access.ratelimit import RateLimiter
    from sandboxd.access.tokens import TokenStore

log = logging.getLogger("sandboxd")


class StartupRefused(SandboxdError, RuntimeError):
    """The default backend failed its confinement self-test and --allow-unconfined is off."""

    code = "startup-refused"


class BodySizeLimit:
    """Refuse request bodies over ``max_bytes`` with 413 problem+json (declared or streamed)."""

    def __init__(self, app: ASGIApp, max_bytes: int,
                 exempt: Callable[[Scope], bool] = lambda scope: False) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exempt = exempt  # requests whose route bounds its body itself (file uploads)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.exempt(scope):
            await self.app(scope, receive, send)
            return
        if self._declared_too_large(scope):
            await self._refuse(scope, receive, send)
            return
        seen = 0
        too_large = False
        refused = False

        async def counting_receive() -> Message:
            nonlocal seen, too_large
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    too_large = True
                    raise problems.Problem(413, "too-large", "Request too large", self._detail())
            return message

        async def guarded_send(message: Message) -> None:
            # a streamed (chunked) body over the limit: whatever the app makes of the error
            # raised while it reads the body (FastAPI: a 400), the answer is the 413
            nonlocal refused
            if not too_large:
                await send(message)
            elif not refused and message["type"] == "http.response.start":
                refused = True
                await self._refuse(scope, receive, send)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except problems.Problem:
            if not too_large or refused:
                raise
            refused = True
            await self._refuse(scope, receive, send)

    def _declared_too_large(self, scope: Scope) -> bool:
        """Whether the request's ``Content-Length`` (the last one, as a dict of the headers
        would keep) declares a body over the limit."""
        declared = None
        for key, value in scope.get("headers") or ():
            if key == b"content-length":
                declared = value
        return declared is not None and declared.isdigit() and int(declared) > self.max_bytes

    def _detail(self) -> str:
        return (f"the request body is larger than {self.max_bytes} bytes (setting "
                "max_body_bytes); send a file with PUT /v1/sessions/{id}/files/{path} instead "
                "(streamed, bounded by the session's quota, not by this limit)")

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problems.problem_response(
            problems.Problem(413, "too-large", "Request too large", self._detail()))
        await response(scope, receive, send)


def create_app(settings: Settings, *, service: Sandboxd | None = None) -> FastAPI:
    """The ASGI app; the service starts in the lifespan and stops (drained) at shutdown."""
    service = service or Sandboxd(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            await _self_test(service, settings)
            loop = asyncio.get_running_loop()
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGHUP, service.reload_policy)
            flusher = asyncio.create_task(_flush_failed_auth(failed_auth))
            try:
                async with mcp.run():  # the MCP sessions' task group lives in the lifespan
                    # a client left without a valid token loses its sessions and kernels
                    revoker = (asyncio.create_task(revocation.watch(tokens, service, mcp),
                                                   name="revocation")
                               if (tokens := app.state.tokens) is not None else None)
                    try:
                        yield
                    finally:
                        if revoker is not None:
                            await stop_task(revoker)
            finally:
                await stop_task(flusher)
        finally:
            notify_systemd("STOPPING=1")
            await service.drain(settings.drain_grace_s)
            failed_auth.flush()  # the failures of the last interval, before the log closes
            await service.close()

    failed_auth = FailedAuthGuard(
        service.audit_event, limit=settings.auth_failure_limit,
        window_s=settings.auth_failure_window_s,
        interval_s=settings.auth_failure_audit_interval_s)
    app = FastAPI(
        title="sandboxd",
        version=__version__,
        description="Hardened sandboxed execution of AI-agent tool calls.",
        lifespan=lifespan,
        openapi_url=None, docs_url=None, redoc_url=None,  # served below, behind the token
    )
    app.state.service = service
    app.state.tokens = _load_tokens(settings)
    app.state.rate_limiter = _rate_limiter(settings)
    app.state.failed_auth = failed_auth
    problems.install(app)
    contract.install(app, tokens=app.state.tokens is not None)
    app.include_router(router)
    app.include_router(files.router)
    app.include_router(approvals.router)
    e2b.install(app, service)  # E2B's wire protocol (docs/e2b.md)
    # the MCP front door (Streamable HTTP): a plain ASGI endpoint at exactly /mcp (every
    # method: POST messages, GET the notification stream, DELETE ends the session)
    mcp = LazyMcpDoor(service)
    app.state.mcp = mcp
    app.router.routes.append(Route("/mcp", endpoint=mcp, include_in_schema=False))
    _add_docs(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes,
                       exempt=files.bounds_own_body)
    app.add_middleware(BrowserGuard, allowed_origins=settings.allowed_origins,
                       allowed_hosts=settings.allowed_hosts,
                       check_host=app.state.tokens is None)
    # outermost: the answers of every layer below, refusals included
    app.add_middleware(CloseWhileDraining, draining=lambda: service.draining)
    return app


async def _flush_failed_auth(failed_auth: FailedAuthGuard) -> None:
    """Write the aggregated failed-authentication records at the end of every interval."""
    while True:
        await asyncio.sleep(failed_auth.interval_s)
        try:
            failed_auth.flush()
        except Exception:  # never let the flusher die
            log.exception("flushing the failed-authentication records failed")


def _add_docs(app: FastAPI) -> None:
    """``/openapi.json``, ``/docs`` and ``/redoc``: FastAPI's, but behind the token unless the
    ``open_endpoints`` setting names ``docs``."""
    docs = [Depends(guard("docs"))]

    @app.get("/openapi.json", include_in_schema=False, dependencies=docs)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=docs)
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - docs")

    @app.get("/redoc", include_in_schema=False, dependencies=docs)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - ReDoc")


async def _self_test(service: Sandboxd, settings: Settings) -> None:
    # the default backend's probe only: the others are probed by /readyz (and doctor)
    default = default_backend()
    why = (backend_failure(await service.probes.report(default))
           if default in service.backends else "backend unavailable")
    if why is None:
        return
    if settings.allow_unconfined:
        log.critical("CONFINEMENT SELF-TEST FAILED for the %s backend (%s); serving anyway "
                     "because --allow-unconfined is set", default, why)
        service.audit_event("unconfined_start", backend=default, reason=why)
        return
    message = (
        f"the {default} backend failed its confinement self-test ({why}); "
        "refusing to serve (use --allow-unconfined to override, at your own risk)"
    )
    log.critical(message)
    service.audit_event("startup_refused", backend=default, reason=why)
    raise StartupRefused(message)


def _load_tokens(settings: Settings) -> TokenStore | None:
    if settings.tokens_file is None:
        return None
    from sandboxd.access.tokens import TokenStore

    return TokenStore.load(settings.tokens_file)


def _rate_limiter(settings: Settings) -> RateLimiter | None:
    if settings.rate_limit_per_minute <= 0:
        return None
    from sandboxd.access.ratelimit import RateLimiter

    return RateLimiter(settings.rate_limit_per_minute)


def notify_systemd(message: str) -> None:
    """Tell systemd (Type=notify) about our state; a no-op outside systemd."""
    try:
        from sandboxd.health.notify import notify
    except ImportError:
        return
    with contextlib.suppress(Exception):
        notify(message)
