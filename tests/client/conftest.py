"""Fixtures of the client tests: a real daemon with a bearer token for one client."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandboxd.tokens import add_token
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


def _start(tmp_path: Path) -> Iterator[TokenDaemon]:
    tokens = tmp_path / "tokens.yaml"
    token = add_token(tokens, "alice")
    args = ["--tokens-file", str(tokens), *DAEMON_ARGS]
    with running_daemon(tmp_path, args=args, token=token) as d:
        yield TokenDaemon(d, token)


@pytest.fixture(scope="module")
def token_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenDaemon]:
    """A real ``sandboxd serve`` (default policy) that requires a bearer token; shared by
    the tests of one module (each test uses its own sessions)."""
    yield from _start(tmp_path_factory.mktemp("daemon"))


@pytest.fixture
def own_token_daemon(tmp_path: Path) -> Iterator[TokenDaemon]:
    """Like ``token_daemon`` but for one test alone (for tests that read its audit log)."""
    yield from _start(tmp_path)
