"""Fixtures of the client tests: a daemon with a bearer token for one client, real or its app
in process (tests/support/inprocess.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandboxd.access.tokens import add_token
from sandboxd_client import AsyncSandboxClient, SandboxClient
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.inprocess import InProcessDaemon, inprocess_daemon

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


@dataclass
class InProcessTokenDaemon:
    """The daemon's app in process (scripted backends), requiring alice's bearer token; the
    clients it makes reach it through its in-process transports."""

    daemon: InProcessDaemon
    token: str

    @property
    def url(self) -> str:
        return self.daemon.url

    def client(self, token: str | None = None, **kwargs: object) -> SandboxClient:
        """A :class:`SandboxClient` of this daemon (alice's unless ``token``)."""
        return SandboxClient(self.url, token=token or self.token,
                             transport=self.daemon.transport, **kwargs)  # type: ignore[arg-type]

    def async_client(self, token: str | None = None) -> AsyncSandboxClient:
        """An :class:`AsyncSandboxClient` of this daemon (alice's unless ``token``)."""
        return AsyncSandboxClient(self.url, token=token or self.token,
                                  transport=self.daemon.async_transport())


@pytest.fixture
def inproc_token_daemon(tmp_path: Path) -> Iterator[InProcessTokenDaemon]:
    """Like ``token_daemon``, in process: for tests of the client's side of the API."""
    tokens = tmp_path / "tokens.yaml"
    token = add_token(tokens, "alice")
    with inprocess_daemon(tmp_path, env={"SANDBOXD_TOKENS_FILE": str(tokens)},
                          token=token) as d:
        yield InProcessTokenDaemon(d, token)
