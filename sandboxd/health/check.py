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
#: how much of an unready answer's body the check prints (the engine keeps 4 KiB of output)
WHY_BYTES = 2048


def verdict(path: str = SOCKET, port: int | None = None,
            timeout: float = TIMEOUT_S) -> tuple[bool, str]:
    """``(healthy, why not)``: whether the daemon answers ``/readyz`` with 200 on ``path``
    when it exists, else on 127.0.0.1 at ``port`` (default ``SANDBOXD_PORT``, else the
    daemon's default port); when not, one line saying why (the status and the start of the
    body, whose ``backends``, ``storage`` and ``draining`` name what fails; or the error)."""
    conn: http.client.HTTPConnection
    if os.path.exists(path):
        conn = UnixHTTPConnection(path, timeout)
    else:
        if port is None:
            port = int(os.environ.get("SANDBOXD_PORT") or urlsplit(DEFAULT_URL).port or 0)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        if response.status == 200:
            return True, ""
        body = response.read(WHY_BYTES).decode("utf-8", "replace")
        return False, f"/readyz answered {response.status}: {' '.join(body.split())}"
    except (OSError, http.client.HTTPException) as exc:
        return False, f"/readyz: {type(exc).__name__}: {exc}"
    finally:
        conn.close()


def ready(path: str = SOCKET, port: int | None = None, timeout: float = TIMEOUT_S) -> bool:
    """Whether the daemon answers ``/readyz`` with 200 (:func:`verdict`)."""
    return verdict(path, port, timeout)[0]


def main() -> None:
    """Exit 0 when healthy; else print why (the engine keeps it in the container's health
    log, which ``docker inspect`` shows) and exit 1."""
    healthy, why = verdict(SOCKET)
    if not healthy:
        print(why, flush=True)
    sys.exit(0 if healthy else 1)


if __name__ == "__main__":
    main()
