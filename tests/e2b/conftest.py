"""A real daemon (container backend, the data-science image) that E2B's own SDKs reach by
their environment alone, with two clients' tokens (``alice``, ``bob``): what every test of
this folder runs E2B's documented examples against."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from sandboxd.access.tokens import add_token
from tests.datascience import conftest as datascience
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.wheels import make_pip_wheel, make_wheel

POLICY = """\
version: 1
name: e2b
clients: ["*"]
limits: {timeout: 60s, max_timeout: 120s, memory: 1Gi, max_memory: 2Gi, pids: 128}
network: none
tools:
  python:
    backend: container
    image: sandboxd/datascience:latest
    # smolagents' tool definitions import the last line's modules (pickle only when its
    # executor allows pickle, but the check reads every import of the code)
    imports:
      allow: [numpy, pandas, matplotlib, math, json, time, os, io, base64, sys, random,
              typing, collections, datetime, itertools, queue, re, stat, statistics,
              unicodedata, PIL, decimal, pathlib, dataclasses, pickle]
      deny: [socket, subprocess, ctypes, urllib, http]
    # `!pip install` cells are install_packages (smolagents sends `!pip install pillow numpy`)
    packages: {allow: [pillow, numpy]}
  shell:
    backend: container
    commands:
      allow: [echo, ls, cat, sleep, seq, "true", "false", mkdir, mv, rm, python3, pwd,
              printenv]
      deny: [curl, wget, sh, bash, env]
  # run_code(language="bash"): the session's bash kernel, running what shell allows
  bash: {backend: container}
  javascript: {backend: container}
  typescript: {backend: container}
  read_file: {paths: {allow: ["**"]}, max_bytes: 4Mi}
  write_file: {paths: {allow: ["**"]}, max_bytes: 4Mi}
  list_files: {paths: {allow: ["**"]}}
"""

#: the data-science image, present and current (its fixture, shared with tests/datascience)
datascience_image = datascience.datascience_image


@dataclass
class E2bDaemon:
    """The daemon, its two clients' tokens and the E2B environment of each."""

    daemon: RunningDaemon
    tokens: dict[str, str]

    def env(self, who: str = "alice") -> dict[str, str]:
        return {"E2B_API_URL": self.daemon.url, "E2B_SANDBOX_URL": self.daemon.url,
                "E2B_API_KEY": self.tokens[who], "E2B_DOMAIN": "sandboxd.invalid"}


@pytest.fixture(scope="module")
def e2b_daemon(tmp_path_factory: pytest.TempPathFactory, docker_client: Any,
               datascience_image: str) -> Iterator[E2bDaemon]:
    tmp = tmp_path_factory.mktemp("e2b")
    policies = tmp / "policies"
    policies.mkdir()
    (policies / "e2b.yaml").write_text(POLICY)
    tokens_file = tmp / "tokens"
    tokens = {who: add_token(tokens_file, who) for who in ("alice", "bob")}
    wheelhouse = tmp / "wheelhouse"
    wheelhouse.mkdir()
    make_pip_wheel(wheelhouse)
    # the image has pillow and numpy already: the wheelhouse's are empty stand-ins (their
    # metadata only), so that pip, which installs into the session, finds something to install
    for name in ("pillow", "numpy"):
        make_wheel(wheelhouse, name, "0.0.1", {})
    env = {"SANDBOXD_TOKENS_FILE": str(tokens_file), "SANDBOXD_SESSION_TTL_S": "600",
           "SANDBOXD_WHEELHOUSE": str(wheelhouse)}
    with running_daemon(tmp, policies_dir=policies, env=env, token=tokens["alice"]) as d:
        yield E2bDaemon(d, tokens)


@pytest.fixture
def e2b_env(e2b_daemon: E2bDaemon, monkeypatch: pytest.MonkeyPatch) -> E2bDaemon:
    """The E2B SDK's environment pointed at the daemon, as ``alice``."""
    for key, value in e2b_daemon.env().items():
        monkeypatch.setenv(key, value)
    return e2b_daemon
