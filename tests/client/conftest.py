"""Fixtures of the client tests: a real daemon with a bearer token for one client."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandboxd.auth import add_token
from tests.support.daemon import RunningDaemon, running_daemon

# Extra `sandboxd serve` arguments of every client test daemon (empty: the real default).
DAEMON_ARGS: list[str] = []


@dataclass
class TokenDaemon:
    daemon: RunningDaemon
    token: str

    @property
    def url(self) -> str:
        return self.daemon.url


@pytest.fixture
def token_daemon(tmp_path: Path) -> Iterator[TokenDaemon]:
    """A real ``sandboxd serve`` (default policy) that requires a bearer token."""
    tokens = tmp_path / "tokens.yaml"
    token = add_token(tokens, "alice")
    args = ["--tokens-file", str(tokens), *DAEMON_ARGS]
    with running_daemon(tmp_path, args=args, token=token) as d:
        yield TokenDaemon(d, token)
