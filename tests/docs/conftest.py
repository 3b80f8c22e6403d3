"""Fixtures of the doc examples: the daemons they talk to, as the docs assume them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandboxd.access.tokens import add_token
from tests.datascience.conftest import datascience_image  # noqa: F401 (a fixture)
from tests.docs.blocks import REPO
from tests.support.daemon import RunningDaemon, running_daemon


@pytest.fixture(scope="module")
def doc_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """`make run`'s daemon: the default policy, no tokens (loopback client ``local``)."""
    with running_daemon(tmp_path_factory.mktemp("daemon")) as d:
        yield d


@dataclass
class TokenDaemon:
    daemon: RunningDaemon
    token: str
    token_file: Path  # the token alone, mode 0600, as the MCP section says to keep it


@pytest.fixture(scope="module")
def doc_token_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenDaemon]:
    """A daemon with a tokens file (the MCP host configurations carry a token)."""
    tmp = tmp_path_factory.mktemp("tokens")
    token = add_token(tmp / "tokens.yaml", "host")
    token_file = tmp / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    with running_daemon(tmp, args=["--tokens-file", str(tmp / "tokens.yaml")],
                        token=token) as d:
        yield TokenDaemon(d, token, token_file)


@pytest.fixture(scope="module")
def doc_datascience_daemon(datascience_image: str,  # noqa: F811
                           tmp_path_factory: pytest.TempPathFactory
                           ) -> Iterator[RunningDaemon]:
    """`make run PROFILE=datascience`'s daemon: policies/examples, no tokens."""
    with running_daemon(tmp_path_factory.mktemp("datascience"),
                        policies_dir=REPO / "policies" / "examples") as d:
        yield d
