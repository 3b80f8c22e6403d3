"""The HTTP floor of a kernel call (the part no change to sandboxd's own code
can save): what the daemon's server stack alone costs.

    python bench/http_floor.py {asgi,fastapi}    # serves; prints its port on the first line

Serves one trivial ``POST /v1/tools/python/invoke`` (reads the body, answers a fixed JSON
result of a kernel call's size) with the daemon's stack: uvicorn on uvloop with uvicorn's
automatic HTTP protocol (httptools when installed: what ``sandboxd serve`` wraps),
``ws="none"``, no proxy headers, no server header, log level ``info`` (its access log), on
127.0.0.1 over TCP. ``asgi``: a bare ASGI app (uvicorn alone); ``fastapi``: a FastAPI route
(the framework's request and response path, nothing of sandboxd). :func:`floor_p50` runs it
and times the same client the bench uses (``httpx.Client``, keep-alive)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response

PATH = "/v1/tools/python/invoke"
#: a kernel call's result as the daemon answers it (the same size, more or less)
ANSWER = json.dumps({
    "id": "inv_0123456789abcdef01234567", "tool": "python", "status": "ok",
    "backend": "restricted", "session": "ses_0123456789abcdef01234567", "stdout": "1\n",
    "stderr": "", "outputs": [], "message": None, "node": None,
    "termination": {"reason": "exited", "exit_code": 0, "signal": None},
    "resources": {"wall_s": 0.0011, "cpu_s": 0.0009, "max_rss_bytes": 0},
    "limits": {"timeout_s": 30.0, "memory_bytes": 536870912, "cpu_s": 30.0},
    "policy": {"name": "default", "rule": "tools.python", "source": "policies/default.yaml"},
    "truncated": {"stdout": False, "stderr": False},
    "cleanup": {"verified": True, "detail": None},
    "kernel": {"kept": True, "interrupted": False, "lost": False, "restarted": False},
}).encode()


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(ANSWER)).encode())]})
    await send({"type": "http.response.body", "body": ANSWER})


def fastapi_app() -> FastAPI:
    app = FastAPI()

    @app.post(PATH)
    async def invoke(request: Request) -> Response:
        await request.body()
        return Response(ANSWER, media_type="application/json")

    return app


def serve(kind: str) -> None:
    import uvicorn
    import uvloop

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the access log (uvicorn's goes to stdout): written, not read
    logging.basicConfig(level="INFO")
    app = asgi_app if kind == "asgi" else fastapi_app()
    config = uvicorn.Config(app, ws="none", log_level="info", proxy_headers=False,
                            server_header=False, lifespan="off")
    uvloop.run(uvicorn.Server(config).serve(sockets=[sock]))


def floor_p50(kind: str, calls: int, body: dict[str, Any]) -> float:
    """p50 (ms) of ``calls`` POSTs of ``body`` to a fresh floor server of ``kind``."""
    from tests.support.wait import wait_until  # the bench puts the checkout on sys.path

    proc = subprocess.Popen([sys.executable, __file__, kind], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            wait_until(lambda: client.post(PATH, json=body).status_code == 200, timeout=60,
                       what="the HTTP floor's server", ignore=(httpx.TransportError,))
            times = []
            for i in range(calls + 10):
                t0 = time.perf_counter()
                resp = client.post(PATH, json=body)
                elapsed = time.perf_counter() - t0
                if resp.status_code != 200 or resp.json()["status"] != "ok":
                    raise RuntimeError(f"http floor: {resp.status_code}")
                if i >= 10:
                    times.append(elapsed)
    finally:
        proc.terminate()
        proc.wait(30)
    times.sort()
    return times[len(times) // 2] * 1000


if __name__ == "__main__":
    serve(sys.argv[1])
