"""What the egress proxy reads and writes on the wire: a request head (bounded), a refusal,
and the server name of a TLS ClientHello."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT_S = 10.0  # a request head (or a ClientHello, a handshake) that trickles: slowloris
CONNECT_TIMEOUT_S = 10.0  # to the server
IDLE_TIMEOUT_S = 300.0  # a connection with no byte either way for this long is closed
_TOKEN = re.compile(r"^[A-Z]{1,16}$")
_HOSTPORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]{1,253})"
                       r"(?::(?P<port>[0-9]{1,5}))?$")
#: the headers a client addresses to the proxy (never forwarded upstream)
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authorization",
                        "proxy-authenticate", "te", "trailer", "upgrade"})


class BadRequest(ValueError):
    """A request head the proxy does not accept (said in the refusal, with no rule)."""


@dataclass
class Head:
    """A parsed request head: ``host`` lower case, ``port``, ``path`` (origin form)."""

    method: str
    host: str
    port: int
    path: str
    version: str
    headers: list[tuple[str, str]] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name), None)


def split_hostport(text: str, default_port: int | None) -> tuple[str, int]:
    match = _HOSTPORT.match(text)
    if match is None:
        raise BadRequest("malformed host")
    port = int(match["port"]) if match["port"] else default_port
    if port is None or not 1 <= port <= 65535:
        raise BadRequest("a port is needed (1-65535)")
    return match["host"].lower().strip("[]"), port


def parse_head(data: bytes, origin: tuple[str, int] | None = None) -> Head:
    """A proxy request: ``CONNECT host:port`` or an absolute ``http://`` URL; with
    ``origin`` (a terminated tunnel's host and port), an origin-form request to it."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest("the request head is not ASCII") from None
    lines = text.split("\r\n")
    method, target, version = _request_line(lines[0])
    headers = _header_fields(lines[1:])
    host, port, path = _target(method, target, origin)
    return Head(method, host, port, path, version, headers)


def _request_line(line: str) -> tuple[str, str, str]:
    """The method, target and HTTP version of a request line."""
    parts = line.split(" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or parts[2] not in ("HTTP/1.1",
                                                                         "HTTP/1.0"):
        raise BadRequest("malformed request line")
    return parts[0], parts[1], parts[2]


def _header_fields(lines: list[str]) -> list[tuple[str, str]]:
    """The header fields (name, value stripped); empty lines skipped."""
    headers: list[tuple[str, str]] = []
    for line in lines:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
            raise BadRequest("malformed header")
        headers.append((name, value.strip()))
    return headers


def _target(method: str, target: str, origin: tuple[str, int] | None) -> tuple[str, int, str]:
    """The host, port and path a request names: a tunnelled request's path at ``origin``, a
    CONNECT's host and port (no path), or an absolute ``http://`` URL's three."""
    if origin is not None:
        if not target.startswith("/") or method == "CONNECT":
            raise BadRequest("a request in a tunnel names a path (origin form)")
        return origin[0], origin[1], target
    if method == "CONNECT":
        host, port = split_hostport(target, None)
        return host, port, ""
    return _absolute(target)


def _absolute(target: str) -> tuple[str, int, str]:
    """The host, port and path of an absolute ``http://`` URL (no user info)."""
    url = urlsplit(target)
    if url.scheme != "http" or not url.netloc or "@" in url.netloc:
        raise BadRequest("only absolute http:// URLs (or CONNECT for https) are proxied")
    host, port = split_hostport(url.netloc, 80)
    return host, port, (url.path or "/") + (f"?{url.query}" if url.query else "")


def body_length(head: Head) -> int:
    """How many body bytes follow the head: exactly its ``Content-Length`` (0 without one),
    and not one more: bytes after it (a pipelined second request that a server might read
    despite ``Connection: close``) never reach the server unchecked. Chunked bodies are
    refused (they would need a parser here)."""
    if head.header("transfer-encoding") is not None:
        raise BadRequest("chunked request bodies are not proxied (send a Content-Length)")
    values = [v for k, v in head.headers if k.lower() == "content-length"]
    if not values:
        return 0
    if len(values) > 1 or not values[0].isdigit() or len(values[0]) > 15:
        raise BadRequest("malformed Content-Length")
    return int(values[0])


def upstream_head(head: Head, drop: frozenset[str] = frozenset(),
                  add: tuple[str, ...] = ()) -> bytes:
    """The request as the origin server gets it: origin form, no hop-by-hop headers (nor
    those named in ``drop``, lower case), the lines of ``add``, and one request per connection
    (``Connection: close``: every request is checked on its own)."""
    dropped = HOP_BY_HOP | drop
    lines = [f"{head.method} {head.path} HTTP/1.1"]
    lines += [f"{k}: {v}" for k, v in head.headers if k.lower() not in dropped]
    lines += [*add, "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _printable(text: str) -> str:
    return re.sub(r"[^\x20-\x7e]", "?", text)


def refusal(reason: str, rule: str, status: int = 403) -> bytes:
    """The proxy's answer to a refused request: the reason in the status line (clients such
    as urllib show only that for a refused CONNECT) and the body, the rule in a header."""
    safe = _printable(reason)[:400]
    body = f"sandboxd egress: {safe}\n".encode()
    phrase = {403: "Forbidden", 400: "Bad Request", 502: "Bad Gateway",
              503: "Service Unavailable"}.get(status, "Refused")
    return (f"HTTP/1.1 {status} {phrase} by sandboxd egress: {safe}\r\n"
            f"Content-Type: text/plain\r\nX-Sandboxd-Egress-Rule: "
            f"{_printable(rule)[:200]}\r\n"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def record_length(header: bytes) -> int | None:
    """The length of a TLS handshake record from its 5-byte header; None: not one."""
    if len(header) < 5 or header[0] != 0x16 or header[1] != 3:
        return None
    return int.from_bytes(header[3:5], "big")


def client_hello_sni(record: bytes) -> str | None:
    """The ``server_name`` of a TLS ClientHello record (its full bytes, header included);
    None when it names none. ``ValueError`` for anything that is not a ClientHello."""
    try:
        body = record[5:]
        if body[0] != 1:
            raise ValueError("not a ClientHello")
        pos = 4 + 2 + 32  # handshake header, version, random
        pos += 1 + body[pos]  # session id
        pos += 2 + int.from_bytes(body[pos:pos + 2], "big")  # cipher suites
        pos += 1 + body[pos]  # compression methods
        if pos >= len(body):
            return None
        end = pos + 2 + int.from_bytes(body[pos:pos + 2], "big")
        pos += 2
        while pos + 4 <= end:
            kind = int.from_bytes(body[pos:pos + 2], "big")
            size = int.from_bytes(body[pos + 2:pos + 4], "big")
            ext = body[pos + 4:pos + 4 + size]
            if kind == 0:
                return _server_name(ext)
            pos += 4 + size
        return None
    except (IndexError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed ClientHello: {exc}") from None


def _server_name(ext: bytes) -> str:
    """The name of a ``server_name`` extension: list length, type (0: host_name), length,
    name (``ValueError`` for another shape; ``UnicodeDecodeError`` for a name not ASCII)."""
    if len(ext) < 5 or ext[2] != 0:
        raise ValueError("malformed server_name")
    size = int.from_bytes(ext[3:5], "big")
    return ext[5:5 + size].decode("ascii").lower()
