"""The client distribution (client/, ``pip install ./client``) on its own: a fresh virtualenv
with it installed from PyPI has nothing of the daemon, and its client calls a real daemon,
attaches to a session by id (sync and async) and hears of a rate limit at once, or after the
bounded retry its caller asked for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandboxd.access.tokens import add_token
from tests.support.daemon import RunningDaemon, running_daemon

ROOT = Path(__file__).resolve().parents[2]
#: the distributions the client may bring: itself, httpx's, httpx-sse and pydantic's
ALLOWED = {"sandboxd-client", "httpx", "httpcore", "h11", "anyio", "idna", "certifi", "sniffio",
           "httpx-sse", "pydantic", "pydantic-core", "annotated-types", "typing-extensions",
           "typing-inspection"}
#: the daemon's own stack, none of which the client may pull in
SERVER = {"sandboxd", "fastapi", "starlette", "uvicorn", "docker", "mcp", "restrictedpython",
          "pyseccomp", "psutil", "pyyaml", "jsonschema", "typer", "prometheus-client"}
#: the daemon's bearer limit for this test: bob goes over it, alice stays under
RATE_LIMIT = 30


@pytest.fixture(scope="module")
def fresh_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a new virtualenv with ``./client`` installed by uv (packages from its
    cache, else PyPI), as README says to install it."""
    venv = tmp_path_factory.mktemp("client-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    uv = Path(sys.executable).parent / "uv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    subprocess.run([str(uv), "pip", "install", "-q", "--python", str(python),
                    str(ROOT / "client")], check=True, timeout=600,
                   env={**env, "UV_LINK_MODE": "copy"})
    return python


@dataclass
class LimitedDaemon:
    daemon: RunningDaemon
    alice: str
    bob: str


@pytest.fixture(scope="module")
def limited_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LimitedDaemon]:
    """A real daemon that requires tokens and limits each holder to RATE_LIMIT calls a
    minute."""
    tmp = tmp_path_factory.mktemp("limited")
    tokens = tmp / "tokens.yaml"
    alice, bob = add_token(tokens, "alice"), add_token(tokens, "bob")
    env = {"SANDBOXD_RATE_LIMIT_PER_MINUTE": str(RATE_LIMIT)}
    with running_daemon(tmp, args=["--tokens-file", str(tokens)], env=env, token=alice) as d:
        yield LimitedDaemon(d, alice, bob)


def test_the_client_installs_nothing_of_the_daemon(fresh_client: Path) -> None:
    code = ("import importlib.metadata as m, json\n"
            "print(json.dumps(sorted({d.metadata['Name'].lower().replace('_', '-') "
            "for d in m.distributions()})))")
    out = subprocess.run([str(fresh_client), "-I", "-c", code], capture_output=True,
                         text=True, check=True, timeout=60)
    installed = set(json.loads(out.stdout)) - {"pip", "setuptools", "wheel"}
    assert "sandboxd-client" in installed and "httpx" in installed
    assert installed <= ALLOWED, installed - ALLOWED
    assert not installed & SERVER
    # every module of the client imports there: none of them needs the daemon
    every = ("import importlib, pkgutil, sandboxd_client\n"
             "names = [m.name for m in pkgutil.walk_packages(sandboxd_client.__path__, "
             "'sandboxd_client.')]\n"
             "for name in names: importlib.import_module(name)\n"
             "print(len(names))")
    run = subprocess.run([str(fresh_client), "-I", "-c", every], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0 and int(run.stdout) >= 15, run.stderr
    for module in ("sandboxd.service", "sandboxd", "fastapi", "uvicorn", "docker", "mcp",
                   "RestrictedPython", "seccomp"):
        run = subprocess.run([str(fresh_client), "-I", "-c", f"import {module}"],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode != 0 and "ModuleNotFoundError" in run.stderr, (module, run.stderr)


def test_the_fresh_client_against_a_real_daemon(fresh_client: Path,
                                                limited_daemon: LimitedDaemon) -> None:
    d = limited_daemon
    run = subprocess.run([str(fresh_client), "-I", str(Path(__file__).with_name(
        "fresh_client_probe.py")), d.daemon.url, d.alice, d.bob], capture_output=True,
        text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.splitlines()[-1])
    assert report["call"] == "42\n"
    # a session reached by id from another client, sync then async: the same variables
    assert report["sync_attached"] == "42\n" and report["open_after_close"] is True
    assert report["async_attached"] == "43\n" and report["kept"] == "43\n"
    assert report["attach_deleted"] == "NotFound"  # its maker's close deleted it
    # the limit's 429 is raised at the first refused call, with the daemon's hint
    assert report["limited_after"] == report["limited_sent"] == RATE_LIMIT + 1
    assert 0 < report["retry_after"] <= 60 and 0 < report["stream_retry_after"] <= 60
    # retries=2: two more requests, the hook told before each, then the typed error
    bounded = report["bounded"]
    assert bounded["error"] == "RateLimited" and bounded["sent"] == 3
    assert bounded["hooked"] == [["RateLimited", 1, 0.01], ["RateLimited", 2, 0.01]]
    assert 0 < bounded["retry_after"] <= 60
