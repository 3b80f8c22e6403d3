"""A real daemon (uvicorn subprocess, HTTP, policy, audit) with the container backend, a real
Docker engine and the javascript profile's image, for the javascript/typescript kernel."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sandboxd.policy.javascript import JAVASCRIPT_IMAGE
from tests.container.conftest import labelled
from tests.container.test_http import daemon_env
from tests.support.ci import require
from tests.support.kernel_daemon import KernelDaemon, kernel_daemon

POLICY = """\
version: 1
name: javascript
clients: ["*"]
limits: {timeout: 30s, max_timeout: 60s, memory: 256Mi, max_memory: 1Gi, cpus: 1.0,
         max_cpus: 2, pids: 64, max_pids: 256, output: 1Mi, max_output: 8Mi}
network: none
tools:
  python:
    backend: container
  javascript:
    backend: container
    modules: {deny: [os]}
  typescript:
    backend: container
    modules: {allow: ["*", worker_threads]}
"""

Daemon = KernelDaemon
#: the grace an interrupted kernel gets (seconds; the daemon's kernel_interrupt_grace_s)
GRACE_S = 2


@pytest.fixture(scope="module")
def daemon(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon per test module; every container it made is gone after it."""
    try:
        docker_client.images.get(JAVASCRIPT_IMAGE)
        present = True
    except Exception:
        present = False
    require(present, f"the javascript profile's image ({JAVASCRIPT_IMAGE}: sandboxd images "
                     "build --profile javascript, which make images runs)")
    env = {**daemon_env(""), "SANDBOXD_KERNEL_INTERRUPT_GRACE_S": str(GRACE_S)}
    with kernel_daemon(tmp_path_factory.mktemp("javascript"), POLICY, "js", env) as d:
        yield d
    assert labelled(docker_client, d.instance) == []
