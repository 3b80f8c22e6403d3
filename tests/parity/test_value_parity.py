"""Tuples stay tuples (a model told a tuple is a list reasons about the wrong type): a call's last
value as both backends report it, one table through a real daemon (the restricted backend and a
container, one-shot and in a session kernel). ``value`` is the value's JSON (a tuple reads as a list
there, as before); ``value_repr`` is Python's repr whenever that JSON would change the value, and
what the model reads (:func:`sandboxd_client.render.format_result`). Both backends must say the
same."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from sandboxd.access.tokens import add_token
from sandboxd.models import Result
from sandboxd_client.render import format_result
from tests.support.daemon import RunningDaemon, running_daemon

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = pytest.mark.same_on_every_host(
    "how both backends report a call's last value (JSON and repr): the runners' and the "
    "daemon's serialisation; no rule, limit or confinement is asserted (test_rule_parity, the "
    "enforcement points, stays in the VM)")

#: (last expression, value, value_repr)
VALUES: list[tuple[str, Any, str | None]] = [
    ("(3, 2)", [3, 2], "(3, 2)"),
    ("()", [], "()"),
    ("[1, (2, 3)]", [1, [2, 3]], "[1, (2, 3)]"),
    ("{'a': (1,)}", {"a": [1]}, "{'a': (1,)}"),
    ("{1: 'a'}", {"1": "a"}, "{1: 'a'}"),
    ("[1, 2]", [1, 2], None),
    ("{'k': [True, None, 2.5]}", {"k": [True, None, 2.5]}, None),
    ("'text'", "text", None),
    ("7", 7, None),
    ("{1, 2}", "{1, 2}", None),  # not JSON at all: the value is its repr already
]

POLICY = """\
version: 1
name: {name}
clients: [{client}]
limits: {{timeout: 30s, max_timeout: 60s, memory: 256Mi, output: 1Mi}}
tools:
  python:
    backend: {backend}
    imports: {{allow: ["*"]}}
"""


@pytest.fixture(scope="module")
def daemon(docker_client: Any, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[RunningDaemon, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("values")
    policies = tmp / "policies"
    policies.mkdir()
    tokens_file = tmp / "tokens.yaml"
    tokens: dict[str, str] = {}
    for backend in ("restricted", "container"):
        (policies / f"{backend}.yaml").write_text(
            POLICY.format(name=f"v-{backend}", client=backend, backend=backend))
        tokens[backend] = add_token(tokens_file, backend)
    env = {"SANDBOXD_TOKENS_FILE": str(tokens_file),
           "SANDBOXD_INSTANCE": f"values{secrets.token_hex(4)}",
           "SANDBOXD_WARM_POOL_SIZE": "1"}
    for name in ("SANDBOXD_PYTHON_IMAGE", "SANDBOXD_SHELL_IMAGE"):  # the image under test
        if name in os.environ:
            env[name] = os.environ[name]
    with running_daemon(tmp, policies_dir=policies, env=env) as d:
        yield d, tokens


def _call(d: RunningDaemon, token: str, code: str, session: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"arguments": {"code": f"x = 1\n{code}"}}
    if session is not None:
        body["session"] = session
    r = d.client.post("/v1/tools/python/invoke", json=body,
                      headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.mark.parametrize("in_session", [False, True], ids=["one-shot", "session"])
def test_both_backends_report_a_value_alike(daemon: tuple[RunningDaemon, dict[str, str]],
                                            in_session: bool) -> None:
    d, tokens = daemon
    sessions: dict[str, str | None] = {b: None for b in tokens}
    if in_session:
        for backend, token in tokens.items():
            r = d.client.post("/v1/sessions", headers={"Authorization": f"Bearer {token}"})
            sessions[backend] = r.json()["id"]
    for code, value, shown in VALUES:
        seen = {}
        for backend, token in tokens.items():
            result = _call(d, token, code, sessions[backend])
            assert result["status"] == "ok" and result["backend"] == backend, result
            seen[backend] = (result["value"], result["value_repr"])
            if shown is not None:  # the model reads Python's view
                assert format_result(Result.model_validate(result)) == f"value: {shown}"
        assert seen["restricted"] == seen["container"] == (value, shown), (code, seen)
