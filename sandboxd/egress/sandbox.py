"""A sandbox's side of egress: what its container gets (the proxy socket and the forwarder
in its runner directory, the proxy variables in every call's environment) and the start of
its forwarder. No Docker network is made: the container keeps Docker's ``none`` network
(loopback only), so nothing but the proxy socket leads out of it (see docs/egress.md)."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

from sandboxd.egress import forwarder
from sandboxd.egress.proxy import EgressProxy, Identity
from sandboxd.egress.rules import EgressRules
from sandboxd.util.deadline import bounded

#: where the container sees its runner directory (sandboxd.backends.container.engine)
RUNNER_DIR = "/run/sandboxd"

#: where the forwarder listens inside the sandbox (its own loopback)
PROXY_PORT = 3128
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"
FORWARDER_NAME = "egress_forwarder.py"
READY_TIMEOUT_S = 15.0


CA_BUNDLE = "egress-ca.pem"


def proxy_env(rules: EgressRules) -> dict[str, str]:
    """The variables that send curl, urllib, pip, git... through the proxy (both spellings:
    tools differ in which they read); with secrets, the CA bundle that trusts the daemon's
    CA beside the usual roots (the terminated hosts' certificates are the daemon's)."""
    env = {"HTTP_PROXY": PROXY_URL, "HTTPS_PROXY": PROXY_URL, "NO_PROXY": ""}
    env = {**env, **{k.lower(): v for k, v in env.items()}}
    if rules.secrets:
        bundle = f"{RUNNER_DIR}/{CA_BUNDLE}"
        env.update({"SSL_CERT_FILE": bundle, "REQUESTS_CA_BUNDLE": bundle,
                    "CURL_CA_BUNDLE": bundle, "PIP_CERT": bundle, "GIT_SSL_CAINFO": bundle})
    return env


def _bundle(ca_pem: bytes) -> bytes:
    """The daemon's CA certificate and the host's roots (the image's own are not readable
    from here; the host's are what the proxy itself trusts)."""
    roots = ssl.get_default_verify_paths().cafile
    try:
        extra = Path(roots).read_bytes() if roots else b""
    except OSError:
        extra = b""
    return ca_pem + b"\n" + extra


async def prepare(proxy: EgressProxy, rundir: Path, uid: int | None, ident: Identity) -> None:
    """Before the container starts: the proxy's socket and the forwarder in its runner
    directory (mounted read-only at ``/run/sandboxd``)."""
    target = rundir / FORWARDER_NAME
    await asyncio.to_thread(shutil.copyfile, forwarder.__file__, target)
    target.chmod(0o644)
    if ident.rules.secrets:  # only the certificate: the CA's key stays in the state dir
        pem = await asyncio.to_thread(lambda: _bundle(proxy.ensure_ca().pem()))
        (rundir / CA_BUNDLE).write_bytes(pem)
        (rundir / CA_BUNDLE).chmod(0o644)
    await proxy.attach(rundir, uid, ident)


async def start(proxy: EgressProxy, ident: Identity, run_exec: Callable[[list[str]],
                                                                          Awaitable[None]],
                mount: str) -> None:
    """Start the forwarder in the running container and wait until it listens (it says so
    on the proxy socket); raises TimeoutError when it does not."""
    await run_exec(["python3", "-I", "-S", f"{mount}/{FORWARDER_NAME}",
                    f"{mount}/egress.sock", str(PROXY_PORT)])
    await bounded(ident.ready.wait(), READY_TIMEOUT_S)
