"""A real daemon (uvicorn subprocess, HTTP, policy, audit) with the container backend and a
real Docker engine, for the session kernels of languages besides Python."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.container.conftest import labelled
from tests.container.test_http import daemon_env
from tests.support.kernel_daemon import KernelDaemon, kernel_daemon

POLICY = """\
version: 1
name: languages
clients: ["*"]
limits: {timeout: 30s, max_timeout: 60s, memory: 256Mi, max_memory: 1Gi, cpus: 1.0,
         max_cpus: 2, pids: 64, max_pids: 256, output: 1Mi, max_output: 8Mi}
network: none
tools:
  python:
    backend: container
    imports: {allow: [time]}
  shell:
    backend: container
    commands:
      allow: [ls, cat, echo, sleep, pwd, "true", "false", python3, head, seq, wc, nice, mkdir]
      deny: [curl, wget, nc, sudo, env, bash]
  bash:
    backend: container
"""

#: the grace an interrupted kernel gets (seconds; the daemon's kernel_interrupt_grace_s)
GRACE_S = 2


#: the daemon of these tests
Daemon = KernelDaemon


@pytest.fixture(scope="module")
def daemon(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon per test module; every container it made is gone after it."""
    env = {**daemon_env(""), "SANDBOXD_KERNEL_INTERRUPT_GRACE_S": str(GRACE_S)}
    with kernel_daemon(tmp_path_factory.mktemp("languages"), POLICY, "lang", env) as d:
        yield d
    assert labelled(docker_client, d.instance) == []
