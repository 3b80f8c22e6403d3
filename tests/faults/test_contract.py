"""The OpenAPI document is true, as clients are generated from it (schemathesis ``--checks
all``, real daemon)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandboxd.access.tokens import add_token
from tests.support.ci import require
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.scale import scaled

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = pytest.mark.same_on_every_host(
    "the OpenAPI contract and the HTTP layer's answers (schemathesis over HTTP, problem types, "
    "a chunked body's limit): the routes and their validation, on the restricted backend, "
    "nothing that reads a cgroup, a unit, a mount or the engine")

#: examples per operation: every operation and every check run at any count; under emulation
#: (the modern-host VM job, tests/support/scale.py) a third of them, make test all 15
EXAMPLES = scaled(15, floor=5)

ENV = {"SANDBOXD_CONTAINER_ENABLED": "false"}
PROBLEM = "application/problem+json"


def _schemathesis(url: str, token: str | None, tmp_path: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("schemathesis")
    require(exe.exists() or shutil.which("schemathesis") is not None,
            "schemathesis (the dev extra)")
    cmd = [str(exe if exe.exists() else "schemathesis"), "run", f"{url}/openapi.json",
           "--checks", "all", "--max-examples", str(EXAMPLES), "--seed", "12", "--no-color",
           "--max-failures", "20", "--request-timeout", "60"]
    if token:
        cmd += ["-H", f"Authorization: Bearer {token}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)


@pytest.mark.parametrize("with_token", [False, True], ids=["no-tokens", "tokens"])
def test_schemathesis_all_checks(tmp_path: Path, with_token: bool) -> None:
    env = dict(ENV)
    token = None
    if with_token:
        tokens = tmp_path / "tokens.yaml"
        token = add_token(tokens, "alice")
        env["SANDBOXD_TOKENS_FILE"] = str(tokens)
        # schemathesis sends every operation without its token: with enough operations that
        # trips the failed-auth limit (429, tests/auth test it), which the 401 checks are not about
        env["SANDBOXD_AUTH_FAILURE_LIMIT"] = "0"
    with running_daemon(tmp_path, env=env, token=token) as d:
        run = _schemathesis(d.url, token, tmp_path)
        assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
        assert d.proc.poll() is None


@pytest.fixture(scope="module")
def plain_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """One daemon for the tests below, which leave it as they found it (a start costs 20-60 s
    under the VM job's emulation)."""
    with running_daemon(tmp_path_factory.mktemp("daemon"), env=ENV) as d:
        yield d


def test_documented_errors_and_strict_types(plain_daemon: RunningDaemon) -> None:
    d = plain_daemon
    doc = d.client.get("/openapi.json").json()
    invoke = doc["paths"]["/v1/tools/{name}/invoke"]["post"]["responses"]
    for status in ("400", "401", "404", "409", "413", "422", "429", "500", "503", "507"):
        assert list(invoke[status]["content"]) == [PROBLEM], status
    assert list(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == [
        "text/plain"]
    # every method of the path is allowed
    r = d.client.options("/v1/sessions/ses_x")
    assert r.status_code == 405
    assert {m.strip() for m in r.headers["allow"].split(",")} >= {"GET", "DELETE"}
    # strict number types: true is not 1.0
    r = d.client.post("/v1/sessions", json={"ttl_s": True})
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM, r.text
    r = d.client.post("/v1/tools/python/invoke",
                      json={"arguments": {"code": "1"}, "limits": {"timeout_s": True}})
    assert r.status_code == 422, r.text
    assert d.client.post("/v1/sessions", json={"ttl_s": 60}).status_code == 201


def test_chunked_body_over_the_limit_is_413(plain_daemon: RunningDaemon) -> None:
    d = plain_daemon
    host, port = d.url.removeprefix("http://").split(":")

    def chunks():  # 2 MiB, streamed without a content-length
        for _ in range(32):
            yield b" " * 65536

    with httpx.Client(base_url=d.url, timeout=60) as client:
        r = client.post("/v1/tools/python/invoke", content=chunks(),
                        headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert r.headers["content-type"] == PROBLEM
    # the daemon still serves
    with socket.create_connection((host, int(port)), timeout=10):
        pass
    assert d.client.get("/healthz").status_code == 200
