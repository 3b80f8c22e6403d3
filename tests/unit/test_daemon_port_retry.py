"""Test support: a port that another process binds between ``free_port()`` and the daemon's
bind costs a retry on another port, not a failed test (a
test that guessed gets the event it needs; several daemons and test runs share this host)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support import daemon as support


def test_a_taken_port_is_retried_on_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()  # another process's server on the port support picks first
        ports = [taken.getsockname()[1]]
        real = support.free_port
        monkeypatch.setattr(support, "free_port", lambda: ports.pop() if ports else real())
        with support.running_daemon(tmp_path, env={"SANDBOXD_CONTAINER_ENABLED": "false"}) as d:
            assert not ports  # the taken port was tried first
            assert d.client.get("/healthz").status_code == 200
            assert d.url != f"http://127.0.0.1:{taken.getsockname()[1]}"
