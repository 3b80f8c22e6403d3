"""``sandboxd serve``, ``tools``, ``invoke`` and ``version``."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import socket
import stat
import sys
from collections.abc import Coroutine
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import typer

from sandboxd import DEFAULT_URL, __version__

if TYPE_CHECKING:
    from sandboxd.config import Settings
    from sandboxd.host.uidclaim import UidClaim
    from sandboxd_client import ToolOutput

# Exit statuses of `serve` (docs/operations.md lists them).
EXIT_SELF_TEST = 3  # start-up refused: policies, backends or the confinement self-test
EXIT_LISTEN = 4  # the address or socket could not be bound (e.g. the port is in use)
EXIT_STATE_LOCKED = 5  # another daemon holds the state directory's lock (sandboxd.host.statelock)
EXIT_UID_RANGE = 6  # another live daemon on this host claims (part of) the sandbox uid range


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"sandboxd: {message}", err=True)
    raise typer.Exit(code)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    host: str | None = typer.Option(None, help="Address to bind (default 127.0.0.1)"),
    port: int | None = typer.Option(None, help="TCP port (default 8765)"),
    uds: Path | None = typer.Option(None, help="Listen on this unix socket instead of TCP"),
    state_dir: Path | None = typer.Option(None, help="Sessions, workspaces, audit log"),
    policies: Path | None = typer.Option(None, help="Directory of policy YAML files"),
    audit_log: Path | None = typer.Option(None, help="Audit log file (JSON Lines)"),
    tokens_file: Path | None = typer.Option(None, help="Tokens file (hashes -> clients)"),
    config: Path | None = typer.Option(None, help="YAML config file"),
    allow_unconfined: bool = typer.Option(
        False, "--allow-unconfined", help="Serve even if the confinement self-test fails"),
    log_level: str = typer.Option("info", help="debug, info, warning, error"),
) -> None:
    """Run the daemon (loopback only unless configured otherwise)."""
    from sandboxd.cli.common import settings_for

    settings = settings_for(config, host=host, port=port, uds=uds, state_dir=state_dir,
                            policies_dir=policies, audit_log=audit_log,
                            tokens_file=tokens_file, allow_unconfined=allow_unconfined or None)
    _check_exposure(settings)
    _lock_state_dir(settings.state_dir)  # first: a second serve on this directory says so
    claim = _claim_uids(settings)  # held until the process exits (SIGKILL included)
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if claim is not None:
        logging.getLogger("sandboxd").info(
            "sandbox uids %d-%d claimed on this host (%s)", claim.first,
            claim.first + claim.count - 1, claim.path)
    try:
        code = _run(_serve(settings, log_level))
    except Exception as exc:
        _fail(str(exc), 1)
        return
    finally:
        if claim is not None:
            claim.release()
    raise typer.Exit(code)


def _check_exposure(settings: Settings) -> None:
    """Refuse a non-loopback address without tokens; warn when one is used with them."""
    if settings.uds is not None or _is_loopback(settings.host):
        return
    if settings.tokens_file is None:
        _fail(f"refusing to listen on {settings.host}: a non-loopback address needs auth "
              "tokens (--tokens-file; create one with `sandboxd token add NAME`)")
    logging.getLogger("sandboxd").warning(
        "listening on non-loopback address %s: every caller needs a token", settings.host)


def _claim_uids(settings: Settings) -> UidClaim | None:
    """This daemon's claim on the sandbox uid range (None: nothing to claim), or exit."""
    from sandboxd.host import uidclaim

    try:
        return uidclaim.claim_for(settings)
    except uidclaim.UidRangeTaken as exc:
        _fail(str(exc), EXIT_UID_RANGE)
    except uidclaim.UidClaimError as exc:
        _fail(str(exc), 1)
    raise AssertionError("unreachable")


def _lock_state_dir(state_dir: Path) -> None:
    """Hold the state directory's lock for the life of this process (before anything there is
    touched), or exit :data:`EXIT_STATE_LOCKED` with one line naming the directory and pid."""
    from sandboxd.host import statelock

    try:
        statelock.acquire(state_dir)  # the descriptor stays open until the process ends
    except statelock.StateDirLocked as exc:
        _fail(str(exc), EXIT_STATE_LOCKED)
    except OSError as exc:
        _fail(f"cannot lock the state directory {state_dir}: {exc}", EXIT_STATE_LOCKED)


def _run(main: Coroutine[Any, Any, int]) -> int:
    """Run the daemon's event loop: uvloop when it is installed (faster), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


async def _serve(settings: Any, log_level: str) -> int:
    import uvicorn

    from sandboxd.api.app import create_app

    app = create_app(settings)
    http = _guarded_http(settings, app.state.service)
    # ws="none": the API has no WebSocket route, so no upgrade path out of the guarded protocol
    config = uvicorn.Config(app, **_listen_on(settings), log_level=log_level, http=http,
                            ws="none", proxy_headers=False, server_header=False,
                            access_log=settings.access_log,
                            timeout_graceful_shutdown=_graceful(settings))
    server = DrainingServer(config, app.state.service, settings.drain_grace_s)
    try:
        await server.serve()
    except SystemExit:  # uvicorn exits 3 for every start-up failure; tell them apart
        if server.lifespan.should_exit:
            return EXIT_SELF_TEST
        where = settings.uds or f"{settings.host}:{settings.port}"
        typer.echo(f"sandboxd: cannot listen on {where} (see the error above; is another "
                   "daemon running there?)", err=True)
        return EXIT_LISTEN
    if settings.uds is not None:
        settings.uds.unlink(missing_ok=True)
    return 0 if server.started else 1


def _listen_on(settings: Any) -> dict[str, Any]:
    """uvicorn's address: the unix socket (its directory made), else host and port."""
    if settings.uds is None:
        return {"host": settings.host, "port": settings.port}
    settings.uds.parent.mkdir(parents=True, exist_ok=True)
    return {"uds": str(settings.uds)}


def _graceful(settings: Any) -> Any:
    """uvicorn's wait for the requests' tasks at a stop that did not drain first (a second
    signal): the calls' half of the stop's bound (float, though uvicorn's hint says int)."""
    return settings.shutdown_timeout_s / 2


def _guarded_http(settings: Any, service: Any) -> type:
    """uvicorn's HTTP protocol with the header timeout and connection caps
    (:mod:`sandboxd.api.connections`)."""
    from sandboxd.api.connections import ConnectionGuard, connection_caps, guarded_protocol

    total, per_peer = connection_caps(settings.max_connections,
                                      settings.max_connections_per_peer)
    closed = service.metrics.connections_closed
    guard = ConnectionGuard(total, per_peer, settings.header_timeout_s,
                            on_close=lambda reason: closed.labels(reason=reason).inc(),
                            body_timeout_s=settings.request_body_timeout_s,
                            write_timeout_s=settings.response_write_timeout_s)
    service.metrics.connections_open.set_function(lambda: len(guard))
    logging.getLogger("sandboxd").info(
        "connections: at most %d open, %d per peer; request headers within %g s",
        total, per_peer, settings.header_timeout_s)
    return guarded_protocol(guard)


def _draining_server_class() -> type:
    import uvicorn

    class _DrainingServer(uvicorn.Server):
        """uvicorn, but SIGTERM/SIGINT first drain (new calls get 503, in-flight calls finish
        within the grace period), then stop and exit 0. A second signal stops at once."""

        def __init__(self, config: uvicorn.Config, service: Any, grace_s: float) -> None:
            super().__init__(config)
            self.service = service
            self.settings = service.settings
            self.grace_s = grace_s
            self._draining = False
            self._loop: asyncio.AbstractEventLoop | None = None
            self._drain_task: asyncio.Task[None] | None = None

        async def serve(self, sockets: Any = None) -> None:
            self._loop = asyncio.get_running_loop()
            if self.config.uds:
                os.umask(0o077)  # the socket file: owner only (grant access by group/ACL)
            await super().serve(sockets)

        async def startup(self, sockets: Any = None) -> None:
            """Bind, then set the socket's mode/group and tell systemd we are ready (only
            now: the lifespan, including the confinement self-test, ran before the bind)."""
            if self.config.uds:
                self._placeholder_after_lifespan(Path(self.config.uds))
            await super().startup(sockets)
            if not self.started:
                return
            if self.config.uds:
                _secure_socket(Path(self.config.uds), self.settings)
            from sandboxd.api.app import notify_systemd

            where = self.config.uds or f"http://{self.config.host}:{self.config.port}"
            notify_systemd(f"READY=1\nSTATUS=serving on {where}")
            logging.getLogger("sandboxd").info("sandboxd ready on %s", where)
            from sandboxd.host import heap

            heap.trim()  # start-up's freed C heap back to the kernel (less idle memory)

        def _placeholder_after_lifespan(self, path: Path) -> None:
            """The owner-only placeholder goes at the socket's path once the lifespan has
            started, right before uvicorn binds there: not earlier, where a client that takes
            the file for a listening daemon would be refused for the whole self-test."""
            lifespan = self.lifespan
            started = lifespan.startup

            async def startup_then_placeholder() -> None:
                await started()
                if not lifespan.should_exit:
                    _owner_only_placeholder(path)

            lifespan.startup = startup_then_placeholder

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self._draining or self._loop is None:
                self.should_exit = True
                self.force_exit = self._draining
                return
            self._draining = True
            self.service.begin_drain()
            self._loop.call_soon_threadsafe(self._start_drain, self._loop)

        def _start_drain(self, loop: asyncio.AbstractEventLoop) -> None:
            # kept: the event loop holds only a weak reference to a task
            self._drain_task = loop.create_task(self._drain())

        async def _drain(self) -> None:
            await self.service.drain(self.grace_s)
            # uvicorn then waits for every request's task (an answer still going out, to a
            # client that may never read it): within what is left of the calls' half of the
            # stop's bound, then it cancels them (shutdown_timeout_s)
            self.config.timeout_graceful_shutdown = self.service.stop_clock.calls_left()
            self.should_exit = True

    return _DrainingServer


def _owner_only_placeholder(path: Path) -> None:
    """Leave an owner-only socket file at ``path`` before uvicorn binds there.

    uvicorn gives a socket file it creates mode 0666 until :func:`_secure_socket` sets the
    configured one, but keeps the mode of a file already there, and asyncio replaces a socket
    file at the path: with this placeholder no moment of the start is world-writable. A path
    that holds anything but a socket is left alone (the bind then fails, as it would have)."""
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return
        path.unlink()
    except FileNotFoundError:
        pass
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as placeholder:
        placeholder.bind(str(path))
    os.chmod(path, 0o600)


def _secure_socket(path: Path, settings: Any) -> None:
    """Give the unix socket the configured mode and group (clients need write access)."""
    if settings.uds_group:
        import grp

        os.chown(path, -1, grp.getgrnam(settings.uds_group).gr_gid)
    os.chmod(path, settings.uds_mode)


def DrainingServer(config: Any, service: Any, grace_s: float) -> Any:
    """A uvicorn server that drains on SIGTERM (see the class docstring)."""
    return _draining_server_class()(config, service, grace_s)


def _connect(url: str, token: str | None) -> Any:
    """A :class:`~sandboxd_client.SandboxClient` for ``url`` (``unix:/path`` for a socket)."""
    from sandboxd_client import SandboxClient

    if url.startswith("unix:"):
        return SandboxClient(socket=url[len("unix:"):], token=token, retries=0)
    return SandboxClient(url, token=token, retries=0)


def _call(url: str, token: str | None, action: Any) -> Any:
    """Run ``action(client)``; a daemon error or an unreachable daemon is one line, exit 1."""
    import httpx

    from sandboxd_client import ConnectionFailed, ProblemError

    try:
        with _connect(url, token) as client:
            return action(client)
    except ConnectionFailed as exc:
        _fail(f"cannot reach the daemon at {url}: {exc}", 1)
    except ProblemError as exc:
        _fail(f"HTTP {exc.status}: {exc.detail or exc.title}", 1)
    except httpx.HTTPError as exc:  # a stream cut short
        _fail(f"the connection to the daemon failed: {exc}", 1)


#: `sandboxd invoke`'s exit status by the result's status (README, "From the CLI")
INVOKE_EXIT = {"ok": 0, "error": 1, "denied": 2, "rejected": 2, "timeout": 3, "killed": 3}

URL_OPTION = typer.Option(DEFAULT_URL, "--url", envvar="SANDBOXD_URL",
                          help="Daemon URL, or unix:/path/to.sock")
TOKEN_OPTION = typer.Option(None, "--token", envvar="SANDBOXD_TOKEN", help="Bearer token")


def tools(
    url: str = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    openai: bool = typer.Option(False, "--openai", help="Print the OpenAI `tools` JSON"),
) -> None:
    """List the tools a running daemon offers you."""
    if openai:
        typer.echo(json.dumps(_call(url, token, lambda c: c.tools("openai")), indent=2))
        return
    for tool in _call(url, token, lambda c: c.tools()):
        mark = "" if tool.available else f"  [unavailable: {tool.unavailable_reason}]"
        typer.echo(f"{tool.name:<14} {tool.backend or '-':<11} {tool.description}{mark}")


def invoke(
    tool: str = typer.Argument(..., help="Tool name"),
    arg: list[str] = typer.Option([], "--arg", "-a", help="key=value (repeatable)"),
    json_args: str | None = typer.Option(None, "--json", help="Arguments as a JSON object"),
    session: str | None = typer.Option(None, help="Session id"),
    timeout: float | None = typer.Option(None, help="Lower the timeout (seconds)"),
    url: str = URL_OPTION,
    token: str | None = TOKEN_OPTION,
    raw: bool = typer.Option(False, "--raw", help="Print the whole result JSON"),
    save_outputs: Path | None = typer.Option(
        None, "--save-outputs", help="Write the call's images here (display-1.png, ...)"),
) -> None:
    """Invoke a tool on a running daemon and print its output as it arrives (display items
    as one line each), then the result's status line on stderr unless it is ok. Exit status
    by the result's status: 0 ok, 1 error, 2 denied or rejected, 3 timeout or killed."""
    arguments = _invoke_arguments(json_args, arg)
    limits = {"timeout_s": timeout} if timeout is not None else None
    if raw:
        result = _call(url, token,
                       lambda c: c.invoke(tool, arguments, session=session, limits=limits))
        typer.echo(result.model_dump_json(indent=2))
    else:
        result = _call(url, token, lambda c: _print_stream(
            c.invoke_stream(tool, arguments, session=session, limits=limits)))
        if result.value is not None and result.tool == "python":
            typer.echo(f"=> {json.dumps(result.value)}")
    if save_outputs is not None:
        _save_images(result, save_outputs)
    if result.status != "ok":
        typer.echo(f"[{result.status}] {result.message or result.termination.reason}", err=True)
    raise typer.Exit(INVOKE_EXIT[result.status])


def _invoke_arguments(json_args: str | None, arg: list[str]) -> dict[str, Any]:
    """The call's arguments: the ``--json`` object, then each ``--arg key=value`` on top
    (exit 2, one line, when either is malformed)."""
    arguments = _json_object(json_args) if json_args is not None else {}
    for item in arg:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--arg '{item}' must look like key=value")
        arguments[key] = value
    return arguments


def _json_object(text: str) -> dict[str, Any]:
    """``--json``'s object, or exit 2 with one line."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        _fail(f"--json is not valid JSON: {exc}")
        raise AssertionError("unreachable") from None
    if isinstance(value, dict):
        return value
    _fail("--json must be a JSON object")
    raise AssertionError("unreachable")


def _print_stream(items: Any) -> Any:
    """Print a streamed call's output as it arrives; return its result."""
    from sandboxd_client import ToolOutput

    ended_line = True
    for item in items:
        if not isinstance(item, ToolOutput):
            if not ended_line:
                sys.stdout.write("\n")
            return item
        ended_line = _show_output(item, ended_line)
    return None


def _show_output(item: ToolOutput, ended_line: bool) -> bool:
    """Print one piece of a call's output (a display item on a line of its own); whether
    stdout now stands at the start of a line."""
    from sandboxd.util.text import visible
    from sandboxd_client.render import describe_output

    if item.kind == "stdout":
        sys.stdout.write(item.text)
        sys.stdout.flush()
        return item.text.endswith("\n")
    if item.kind == "stderr":
        sys.stderr.write(item.text)
        sys.stderr.flush()
        return ended_line
    if item.item is None:
        return ended_line
    if not ended_line:
        sys.stdout.write("\n")
    typer.echo(f"[display] {visible(describe_output(item.item))}")
    return True


def _save_images(result: Any, where: Path) -> None:
    """The result's images as files in ``where`` (created), one line each on stderr."""
    import base64

    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail(f"--save-outputs {where}: {exc.strerror}")
    n = 0
    for item in result.outputs:
        if item.image is None:
            continue
        n += 1
        path = where / f"display-{n}.{item.image[0].split('/')[1].replace('jpeg', 'jpg')}"
        path.write_bytes(base64.b64decode(item.image[1]))
        typer.echo(f"saved {path}", err=True)


def version() -> None:
    """Print the version."""
    typer.echo(f"sandboxd {__version__}")


def register(app: typer.Typer) -> None:
    """Add serve, tools, invoke and version to the main app."""
    app.command()(serve)
    app.command()(tools)
    app.command()(invoke)
    app.command()(version)

