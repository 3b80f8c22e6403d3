"""Keep web pages out: DNS rebinding and cross-origin requests from a browser.

A page the user opens in a browser can make the browser send requests to ``127.0.0.1``: to a
loopback port directly (cross-origin: the browser adds ``Origin``), or, after DNS rebinding, as
``http://evil.example:8377`` resolving to ``127.0.0.1`` (same-origin for the browser: its
``Host`` header names the attacker's domain). Without tokens the daemon serves every loopback
caller as the client ``local``, so either would let the page run code in the user's sandboxes.
The MCP specification requires Streamable HTTP servers to check ``Origin`` for this reason.

Two checks, for the HTTP API and ``/mcp`` alike (``/healthz`` stays open for probes):

* ``Origin``: absent (agents, SDKs, curl, the MCP SDK's clients) passes; present, it must be
  listed in the ``allowed_origins`` setting (default: none), else 403 ``origin-not-allowed``.
* ``Host``, only when no tokens are configured (the tokenless loopback client): it must name
  the loopback (``localhost``, ``127.0.0.1``, ``[::1]``, any port) or be listed in
  ``allowed_hosts``, else 403 ``host-not-allowed``. Requests over the unix socket are not
  reachable from a browser and are not checked for ``Host``.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from sandboxd.api import problems

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
OPEN_PATHS = frozenset({"/healthz"})


def host_name(host_header: str) -> str:
    """The name part of a ``Host`` header (no port, no IPv6 brackets), lower case."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class BrowserGuard:
    """ASGI middleware: refuse requests a web page made a browser send (see module doc)."""

    def __init__(self, app: ASGIApp, *, allowed_origins: list[str], allowed_hosts: list[str],
                 check_host: bool) -> None:
        self.app = app
        self.allowed_origins = {o.rstrip("/").lower() for o in allowed_origins}
        self.allowed_hosts = LOOPBACK_HOSTS | {h.lower() for h in allowed_hosts}
        self.check_host = check_host

    def refusal(self, scope: Scope) -> problems.Problem | None:
        """The 403 problem for this request, or ``None`` when it may pass."""
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            return None
        origin, host = _origin_and_host(scope)
        refused = self._origin_refusal(origin)
        return refused if refused is not None else self._host_refusal(scope, host)

    def _origin_refusal(self, origin: str | None) -> problems.Problem | None:
        """``origin-not-allowed`` for a request a web page made (an ``Origin`` not listed)."""
        if origin is None or origin.rstrip("/").lower() in self.allowed_origins:
            return None
        return problems.Problem(
            403, "origin-not-allowed", "Origin not allowed",
            f"requests from web pages (Origin {origin[:200]!r}) are refused; an "
            "administrator can allow an origin with the allowed_origins setting",
            origin=origin[:200])

    def _host_refusal(self, scope: Scope, host: str | None) -> problems.Problem | None:
        """``host-not-allowed`` for a request over TCP, when ``Host`` is checked, whose
        ``Host`` names neither the loopback nor a listed name (DNS rebinding)."""
        server = scope.get("server")
        if not self.check_host or server is None or server[1] is None:
            return None  # not checked, or over the unix socket (no browser reaches it)
        host = host or ""
        if host_name(host) in self.allowed_hosts:
            return None
        return problems.Problem(
            403, "host-not-allowed", "Host not allowed",
            f"the Host header {host[:200]!r} does not name this machine's loopback "
            "(a DNS rebinding attempt?); use http://127.0.0.1:<port>, or an "
            "administrator can add the name to the allowed_hosts setting",
            host=host[:200])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        problem = self.refusal(scope)
        if problem is None:
            await self.app(scope, receive, send)
            return
        app = scope.get("app")
        service = getattr(getattr(app, "state", None), "service", None)
        if service is not None:
            service.metrics.rejections.labels(reason=problem.slug).inc()
        await problems.problem_response(problem)(scope, receive, send)


def _origin_and_host(scope: Scope) -> tuple[str | None, str | None]:
    """The request's ``Origin`` and ``Host`` (the last of each, as a dict of the headers
    would keep; no dict of every header per request)."""
    origin = host = None
    for key, value in scope.get("headers") or ():
        key = key.lower()
        if key == b"origin":
            origin = value.decode("latin-1")
        elif key == b"host":
            host = value.decode("latin-1")
    return origin, host
