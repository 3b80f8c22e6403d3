"""``max_kernels`` counts each language's kernel of a session: its bash kernel holds a process
and memory of its own beside its python kernel. Through a real daemon and Docker engine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.container.conftest import labelled
from tests.container.test_http import daemon_env
from tests.support.kernel_daemon import KernelDaemon, kernel_daemon

from .conftest import POLICY

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def daemon(docker_client: Any, tmp_path: Any) -> Iterator[KernelDaemon]:
    env = {**daemon_env(""), "SANDBOXD_MAX_KERNELS": "1"}
    with kernel_daemon(tmp_path, POLICY, "kcap", env) as d:
        yield d
    assert labelled(docker_client, d.instance) == []


def _invoke(daemon: KernelDaemon, tool: str, code: str, sid: str) -> Any:
    return daemon.d.client.post(f"/v1/tools/{tool}/invoke", timeout=180, json={
        "arguments": {"code": code}, "session": sid})


def test_a_sessions_bash_kernel_counts_beside_its_python_kernel(daemon: KernelDaemon) -> None:
    one = daemon.session()
    assert _invoke(daemon, "python", "x = 1", one).json()["status"] == "ok"
    capped = _invoke(daemon, "bash", "echo hi", one)  # a second kernel: over the cap
    assert capped.status_code == 429, capped.text
    assert capped.json()["full"] == "max_kernels", capped.text
    assert "new session kernel (container:bash)" in capped.json()["detail"], capped.text
    assert _invoke(daemon, "python", "x", one).json()["value"] == 1  # its own kernel: shared
    daemon.close(one)
    two = daemon.session()
    ran = _invoke(daemon, "bash", "echo hi", two).json()
    assert ran["status"] == "ok" and ran["stdout"] == "hi\n", ran
    assert _invoke(daemon, "python", "1", two).status_code == 429
    daemon.close(two)
