"""The Docker Engine API, as much of it as the container backend uses, on the standard
library's ``http.client``.

The daemon makes about ten kinds of engine request (create, start, update, remove, inspect,
list, pause, unpause, ping). The Docker SDK with requests, urllib3 and charset_normalizer cost
the daemon ~5 MiB of memory and ~0.7 s of every start under emulation (memory
for its whole life, and start time), for
requests this module sends itself; ``sandboxd images`` and ``sandboxd wheelhouse`` (admin
commands that build images) keep the SDK. Requests go to the engine's own API version (no
``/v1.xx`` prefix), as the SDK's version negotiation would choose.

Errors: :class:`NoAnswer` when the engine did not answer (refused, reset, timed out: it may be
gone), :class:`APIError` when it answered with an error (:class:`NotFound` for a 404). Both
are :class:`EngineError`.

Blocking, and thread-safe: each request takes a kept connection (or opens one) and gives it
back once its answer is read, so the backend's worker threads share one :class:`Engine`.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from sandboxd.host.unixhttp import UnixHTTPConnection

DEFAULT_URL = "unix:///var/run/docker.sock"
#: how a kept connection the engine closed while it was idle fails (the close crossed the
#: request); the request is sent again once, on a new connection
_CLOSED_WHILE_IDLE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)
#: an engine answer larger than this is refused (a container list of a busy host is ~1 MiB)
MAX_ANSWER_BYTES = 64 * 1024 * 1024


class EngineError(Exception):
    """The Docker engine could not do what was asked."""


class NoAnswer(EngineError):
    """The engine did not answer: refused, reset or timed out (it may be gone)."""


class APIError(EngineError):
    """The engine answered with an error status."""

    def __init__(self, status: int, explanation: str, what: str) -> None:
        self.status_code = status
        self.explanation = explanation
        super().__init__(f"{status} {http.client.responses.get(status, 'Error')} for {what}: "
                         f"{explanation}")


class NotFound(APIError):
    """The engine answered 404: no such container or image."""


@dataclass(frozen=True)
class Address:
    """Where the engine listens: a unix socket path, or a TCP host and port (TLS or not)."""

    url: str
    unix_path: str | None = None
    host: str = ""
    port: int = 0
    tls: ssl.SSLContext | None = None


def address(url: str | None) -> Address:
    """The engine's address: ``url`` (the ``docker_url`` setting), else ``DOCKER_HOST`` with
    ``DOCKER_TLS_VERIFY`` and ``DOCKER_CERT_PATH`` as the Docker CLI reads them, else the
    default socket. Raises ValueError for what this client cannot reach (``ssh://``)."""
    from_env = url is None
    url = url or os.environ.get("DOCKER_HOST") or DEFAULT_URL
    parts = urlsplit(url)
    if parts.scheme in ("unix", "http+unix"):
        path = parts.path or parts.netloc
        if not path:
            raise ValueError(f"the Docker engine address {url!r} names no socket")
        return Address(url, unix_path=path)
    if parts.scheme not in ("tcp", "http", "https"):
        raise ValueError(f"the Docker engine address {url!r} is not unix://, tcp:// or "
                         "https:// (sandboxd shares paths with the engine: it must be local)")
    if not parts.hostname:
        raise ValueError(f"the Docker engine address {url!r} names no host")
    verify = from_env and bool(os.environ.get("DOCKER_TLS_VERIFY"))
    tls = _tls(verify) if parts.scheme == "https" or verify else None
    port = parts.port or (2376 if tls is not None else 2375)
    return Address(url, host=parts.hostname, port=port, tls=tls)


def _tls(verify: bool) -> ssl.SSLContext:
    """The TLS context of a tcp engine, as the Docker CLI makes it: the engine's certificate
    checked against ``DOCKER_CERT_PATH``'s ``ca.pem`` when ``verify`` (else not checked), and
    the client's own certificate presented when that directory holds one."""
    certs = Path(os.environ.get("DOCKER_CERT_PATH") or Path.home() / ".docker")
    tls = ssl.create_default_context(cafile=str(certs / "ca.pem") if verify else None)
    if not verify:
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    if (certs / "cert.pem").is_file() and (certs / "key.pem").is_file():
        tls.load_cert_chain(str(certs / "cert.pem"), str(certs / "key.pem"))
    return tls


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether a kept connection was closed by the engine (readable while idle: EOF)."""
    sock = conn.sock
    if sock is None:
        return True
    poll = select.poll()  # not select(): the daemon may hold descriptors above 1024
    try:
        poll.register(sock, select.POLLIN)
        return bool(poll.poll(0))
    except (OSError, ValueError):
        return True


class Engine:
    """A client of one engine: the requests the container backend makes."""

    def __init__(self, url: str | None = None, *, timeout: float = 60.0,
                 keep: int = 32) -> None:
        self.address = address(url)
        self.timeout = timeout
        self._keep = keep
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------ the requests

    def ping(self, *, fresh: bool = False) -> None:
        """Raises unless the engine answers ``GET /_ping`` (``fresh``: on a new connection,
        which a stopping engine refuses: it closes its listener first, then stops its
        containers, and answers on the connections it had until it exits)."""
        self.request("GET", "/_ping", fresh=fresh)

    def create(self, body: dict[str, Any], name: str) -> str:
        """Create a container from ``body`` (the engine's ``ContainerConfig`` with its
        ``HostConfig``); returns its id."""
        created = self.request("POST", "/containers/create", query={"name": name}, body=body)
        return str(created["Id"])

    def start(self, cid: str) -> None:
        self.request("POST", _container(cid, "/start"))

    def update(self, cid: str, body: dict[str, Any]) -> None:
        """Change a container's resources (memory, CPU, pids)."""
        self.request("POST", _container(cid, "/update"), body=body)

    def remove(self, cid: str) -> None:
        """Kill and remove a container with its anonymous volumes."""
        self.request("DELETE", _container(cid),
                      query={"force": "1", "v": "1"})

    def pause(self, cid: str) -> None:
        self.request("POST", _container(cid, "/pause"))

    def unpause(self, cid: str) -> None:
        self.request("POST", _container(cid, "/unpause"))

    def exec_detached(self, cid: str, cmd: list[str], user: str) -> None:
        """Start ``cmd`` in the running container as ``user``, detached (its output goes
        nowhere; it ends with the container)."""
        made = self._object(self.request("POST", _container(cid, "/exec"), body={
            "Cmd": cmd, "User": user, "AttachStdin": False, "AttachStdout": False,
            "AttachStderr": False, "Tty": False}))
        self.request("POST", f"/exec/{quote(str(made.get('Id', '')), safe='')}/start",
                     body={"Detach": True, "Tty": False})

    def inspect_container(self, cid: str) -> dict[str, Any]:
        return self._object(self.request("GET", _container(cid, "/json")))

    def inspect_image(self, name: str) -> dict[str, Any]:
        return self._object(self.request("GET", f"/images/{quote(name, safe='/:')}/json"))

    def container_ids(self, label: str) -> list[str]:
        """Ids of every container, running or not, that carries ``label`` (``key=value``)."""
        found = self.request("GET", "/containers/json",
                             query={"all": "1", "filters": json.dumps({"label": [label]})})
        if not isinstance(found, list):
            raise EngineError(f"the engine's container list is not a list: {found!r:.200}")
        return [str(c["Id"]) for c in found]

    # ------------------------------------------------------------ the transport

    def request(self, method: str, path: str, *, query: dict[str, str] | None = None,
                body: dict[str, Any] | None = None, fresh: bool = False) -> Any:
        """One request; its answer parsed as JSON (None when it has no body). Raises
        :class:`NoAnswer` or :class:`APIError`. ``fresh``: on a new connection, closed after."""
        target = path + (f"?{urlencode(query)}" if query else "")
        what = f"{method} {path}"
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Host": "docker"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        conn, reused = (self._connection(), False) if fresh else self._take()
        while True:
            try:
                conn.request(method, target, body=payload, headers=headers)
                response = conn.getresponse()
                data = response.read(MAX_ANSWER_BYTES + 1)
                break
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if reused and isinstance(exc, _CLOSED_WHILE_IDLE):
                    # a kept connection the engine closed as the request went out: it never
                    # saw the request (an engine that died meanwhile refuses the next one)
                    conn, reused = self._connection(), False
                    continue
                raise NoAnswer(f"{self.address.url} did not answer {what}: "
                               f"{_why(exc)}") from exc
        if len(data) > MAX_ANSWER_BYTES:
            conn.close()
            raise EngineError(f"the engine's answer to {what} is over {MAX_ANSWER_BYTES} bytes")
        if fresh:
            conn.close()
        else:
            self._give_back(conn, response)
        status = response.status
        if status >= 400:
            explanation = _explanation(data)
            raise (NotFound if status == 404 else APIError)(status, explanation, what)
        if not data or "json" not in (response.getheader("Content-Type") or ""):
            return None
        try:
            return json.loads(data)
        except ValueError as exc:
            raise EngineError(f"the engine's answer to {what} is not JSON: {exc}") from None

    def close(self) -> None:
        """Close the kept connections (one in use closes when its request ends)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        """A kept connection the engine has not closed (and True), else a new one."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._connection(), False
            if not _dropped(conn):
                return conn, True
            conn.close()

    def _connection(self) -> http.client.HTTPConnection:
        a = self.address
        if a.unix_path is not None:
            return UnixHTTPConnection(a.unix_path, self.timeout)
        if a.tls is not None:
            return http.client.HTTPSConnection(a.host, a.port, timeout=self.timeout,
                                               context=a.tls)
        return http.client.HTTPConnection(a.host, a.port, timeout=self.timeout)

    def _give_back(self, conn: http.client.HTTPConnection,
                   response: http.client.HTTPResponse) -> None:
        if response.will_close:
            conn.close()
            return
        with self._lock:
            if not self._closed and len(self._idle) < self._keep:
                self._idle.append(conn)
                return
        conn.close()

    @staticmethod
    def _object(found: Any) -> dict[str, Any]:
        if not isinstance(found, dict):
            raise EngineError(f"the engine's answer is not an object: {found!r:.200}")
        return found


def _container(cid: str, action: str = "") -> str:
    """A container's path: its id (or name) is one path segment, whatever it holds."""
    return f"/containers/{quote(cid, safe='')}{action}"


def _explanation(data: bytes) -> str:
    """The engine's error message (its JSON ``message``, else the text)."""
    text = data.decode("utf-8", "replace").strip()
    try:
        message = json.loads(text).get("message")
    except (ValueError, AttributeError):
        return text[:2000]
    return str(message if message is not None else text)[:2000]


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
