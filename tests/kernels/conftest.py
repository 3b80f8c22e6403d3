"""A real daemon (uvicorn subprocess, HTTP, policy, audit) with the container backend and a
real Docker engine, for the session kernels of languages besides Python."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.container.conftest import labelled
from tests.container.test_http import daemon_env
from tests.support.daemon import RunningDaemon, running_daemon

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


@dataclass
class Daemon:
    """A daemon with the container backend, and its instance label."""

    d: RunningDaemon
    instance: str

    def session(self) -> str:
        r = self.d.client.post("/v1/sessions", json={})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def call(self, tool: str, code: str, session: str | None = None, timeout_s: float = 30,
             **limits: Any) -> dict[str, Any]:
        """One call of ``tool``; its result object."""
        body: dict[str, Any] = {"arguments": {"code": code},
                                "limits": {"timeout_s": timeout_s, **limits}}
        if session is not None:
            body["session"] = session
        r = self.d.client.post(f"/v1/tools/{tool}/invoke", json=body, timeout=180)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def close(self, session: str) -> None:
        assert self.d.client.delete(f"/v1/sessions/{session}").status_code == 204


@pytest.fixture(scope="module")
def daemon(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon per test module; every container it made is gone after it."""
    tmp = tmp_path_factory.mktemp("languages")
    policies = tmp / "policies"
    policies.mkdir()
    (policies / "languages.yaml").write_text(POLICY)
    instance = f"lang{secrets.token_hex(4)}"
    env = {**daemon_env(instance), "SANDBOXD_KERNEL_INTERRUPT_GRACE_S": str(GRACE_S)}
    with running_daemon(tmp, policies_dir=policies, env=env) as d:
        yield Daemon(d, instance)
    assert labelled(docker_client, instance) == []
