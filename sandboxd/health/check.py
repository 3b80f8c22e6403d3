"""The daemon image's ``HEALTHCHECK`` (Dockerfile): ``GET /readyz`` on the daemon's unix socket,
or on its TCP port when there is no socket; exit status 0 when it answers 200, else 1.

Standard library only, on purpose: the engine runs it every 30 s for as long as the container
lives, and importing an HTTP client library costs several times the request itself."""

from __future__ import annotations

import http.client
import os
import sys
from urllib.parse import urlsplit

from sandboxd import DEFAULT_URL
from sandboxd.host.unixhttp import UnixHTTPConnection

#: where the image's ``serve --uds`` listens (Dockerfile ``CMD``)
SOCKET = "/run/sandboxd/sandboxd.sock"
#: below the ``HEALTHCHECK --timeout`` of 15 s, so the check reports instead of being killed
TIMEOUT_S = 14.0


def ready(path: str = SOCKET, port: int | None = None, timeout: float = TIMEOUT_S) -> bool:
    """Whether the daemon answers ``/readyz`` with 200: on ``path`` when it exists, else on
    127.0.0.1 at ``port`` (default ``SANDBOXD_PORT``, else the daemon's default port)."""
    conn: http.client.HTTPConnection
    if os.path.exists(path):
        conn = UnixHTTPConnection(path, timeout)
    else:
        if port is None:
            port = int(os.environ.get("SANDBOXD_PORT") or urlsplit(DEFAULT_URL).port or 0)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/readyz")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def main() -> None:
    sys.exit(0 if ready(SOCKET) else 1)


if __name__ == "__main__":
    main()
