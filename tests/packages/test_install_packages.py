"""``install_packages`` installs allowed packages from the admin's wheelhouse into a
container session, whose later python calls (its kernel) import them. Through the real daemon
(HTTP and MCP, tokens, policy) and a real Docker engine; the wheels are made here, nothing is
fetched from a network (the session containers have none).

Not in CI's VM job (tests/vm/README.md): pip runs for seconds per install on this host, minutes
under the VM's emulation, and a session container is confined there exactly as the container
lane already proves; ``make test`` runs it on every CI run."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandboxd.access.tokens import add_token
from tests.container.conftest import labelled
from tests.container.test_http import daemon_env
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.wheels import make_pip_wheel, make_wheel

POLICY = """\
version: 1
name: packages
clients: [alice]
limits: {timeout: 120s, max_timeout: 300s, memory: 256Mi, pids: 64, output: 1Mi}
tools:
  python:
    backend: container
    imports: {allow: [os, tinypkg]}
    packages:
      allow: [Tiny_Pkg, "nothere==1.0"]
"""

RESTRICTED = """\
version: 1
name: restricted-packages
clients: [rita]
tools:
  python:
    backend: restricted
    imports: {allow: [math]}
    packages: {allow: [tiny-pkg]}
"""

SITE = ("import os\n"
        "sorted(os.listdir('.site-packages')) if os.path.isdir('.site-packages') else None")


@dataclass
class Daemon:
    d: RunningDaemon
    keys: dict[str, str]
    wheelhouse: Path

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[who]}"}

    def session(self, who: str = "alice") -> str:
        r = self.d.client.post("/v1/sessions", headers=self.auth(who))
        assert r.status_code in (200, 201), r.text
        return str(r.json()["id"])

    def call(self, tool: str, arguments: dict[str, Any], session: str | None = None,
             who: str = "alice") -> dict[str, Any]:
        payload: dict[str, Any] = {"arguments": arguments}
        if session is not None:
            payload["session"] = session
        r = self.d.client.post(f"/v1/tools/{tool}/invoke", json=payload, headers=self.auth(who))
        assert r.status_code == 200, r.text
        return dict(r.json())


@pytest.fixture(scope="module")
def daemon(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("packages")
    wheelhouse = tmp / "wheelhouse"
    wheelhouse.mkdir()
    wheelhouse.chmod(0o755)
    make_pip_wheel(wheelhouse)
    make_wheel(wheelhouse, "tiny-pkg", "1.0",
               {"tinypkg/__init__.py": "from tinydep import VALUE\nANSWER = VALUE + 1\n"},
               requires=("tinydep",))
    make_wheel(wheelhouse, "tinydep", "2.0", {"tinydep/__init__.py": "VALUE = 41\n"})
    policies = tmp / "policies"
    policies.mkdir()
    (policies / "packages.yaml").write_text(POLICY)
    (policies / "restricted.yaml").write_text(RESTRICTED)
    tokens = tmp / "tokens.yaml"
    keys = {name: add_token(tokens, name) for name in ("alice", "rita")}
    instance = f"pkgs{secrets.token_hex(4)}"
    env = {**daemon_env(instance), "SANDBOXD_TOKENS_FILE": str(tokens),
           "SANDBOXD_WHEELHOUSE": str(wheelhouse)}
    with running_daemon(tmp, policies_dir=policies, env=env, token=keys["alice"]) as d:
        yield Daemon(d, keys, wheelhouse)
    assert labelled(docker_client, instance) == []


def test_installed_package_is_imported_by_later_calls_of_the_session(daemon: Daemon) -> None:
    s = daemon.session()
    # the session's kernel is running before the install: it must see the new packages too
    assert daemon.call("python", {"code": "x = 1"}, s)["status"] == "ok"
    r = daemon.call("python", {"code": "import tinypkg"}, s)
    assert r["status"] == "error" and "ModuleNotFoundError" in r["stderr"], r
    before = {p.name for p in daemon.wheelhouse.iterdir()}
    res = daemon.call("install_packages", {"packages": ["tiny-pkg"]}, s)
    assert res["status"] == "ok", res
    assert "Successfully installed tiny-pkg-1.0 tinydep-2.0" in res["stdout"], res
    assert {p.name for p in daemon.wheelhouse.iterdir()} == before  # only ever read
    res = daemon.call("python", {"code": "import tinypkg\n(tinypkg.ANSWER, x)"}, s)
    assert res["status"] == "ok" and res["value"] == [42, 1], (res["stderr"], res["message"])
    # a fresh kernel of the session finds them as well
    r = daemon.d.client.post(f"/v1/sessions/{s}/restart", headers=daemon.auth("alice"))
    assert r.status_code == 200, r.text
    res = daemon.call("python", {"code": "import tinypkg\ntinypkg.ANSWER"}, s)
    assert res["value"] == 42 and res["kernel"]["fresh"] is True, res
    # installed packages obey the import rules: the dependency came along, and importing it
    # is still refused (imports.allow names tinypkg, not tinydep)
    res = daemon.call("python", {"code": "import tinydep"}, s)
    assert res["status"] == "denied" and "tinydep" in res["message"], res
    res = daemon.call("python", {"code": "__import__('tiny' + 'dep')"}, s)
    assert res["status"] == "error" and "tinydep" in res["stderr"], res
    # another session has none of them
    res = daemon.call("python", {"code": "import tinypkg"}, daemon.session())
    assert res["status"] == "error" and "ModuleNotFoundError" in res["stderr"], res


def test_a_package_the_policy_does_not_allow_is_denied_and_nothing_installed(
        daemon: Daemon) -> None:
    s = daemon.session()
    assert daemon.call("install_packages", {"packages": ["tiny.pkg"]}, s)["status"] == "ok"
    site = daemon.call("python", {"code": SITE}, s)["value"]
    assert "tinypkg" in site, site
    # tinydep is in the wheelhouse (a dependency of an allowed package), but not allowed
    res = daemon.call("install_packages", {"packages": ["TINY-PKG", "tinydep"]}, s)
    assert res["status"] == "denied", res
    assert res["message"] == ("Installing `tinydep` is not allowed here; allowed packages: "
                              "nothere==1.0, tiny-pkg."), res
    assert res["policy"]["rule"] == "tools.python.packages.allow", res
    assert daemon.call("python", {"code": SITE}, s)["value"] == site  # unchanged
    fresh = daemon.session()
    res = daemon.call("install_packages", {"packages": ["tinydep"]}, fresh)
    assert res["status"] == "denied", res
    assert daemon.call("python", {"code": SITE}, fresh)["value"] is None
    # names that are not package names never reach pip
    r = daemon.d.client.post("/v1/tools/install_packages/invoke", headers=daemon.auth("alice"),
                             json={"arguments": {"packages": ["--index-url=http://x"]},
                                   "session": fresh})
    assert r.status_code == 422 and "packages.0" in r.text, r.text


def test_an_allowed_package_missing_from_the_wheelhouse_is_a_clear_error(
        daemon: Daemon) -> None:
    s = daemon.session()
    res = daemon.call("install_packages", {"packages": ["nothere"]}, s)
    assert res["status"] == "error" and res["termination"]["exit_code"] == 1, res
    assert "No matching distribution found for nothere==1.0" in res["stderr"], res


def test_refused_without_a_session_and_on_the_restricted_backend(daemon: Daemon) -> None:
    res = daemon.call("install_packages", {"packages": ["tiny-pkg"]})
    assert res["status"] == "denied" and "installs into a session" in res["message"], res
    s = daemon.session("rita")
    res = daemon.call("install_packages", {"packages": ["tiny-pkg"]}, s, who="rita")
    assert res["status"] == "denied", res
    assert "needs a container session" in res["message"], res
    assert "backend: container" in res["message"], res
    tools = daemon.d.client.get("/v1/tools", headers=daemon.auth("alice")).json()
    spec = next(t for t in tools if t["name"] == "install_packages")
    assert spec["description"].endswith("Allowed packages: nothere==1.0, tiny-pkg."), spec


async def test_install_then_import_over_mcp(daemon: Daemon) -> None:
    from tests.mcp.conftest import http_session

    async with http_session(f"{daemon.d.url}/mcp", daemon.keys["alice"]) as mcp:
        listed = await mcp.list_tools()
        assert "install_packages" in [t.name for t in listed.tools]
        res = await mcp.call_tool("install_packages", {"packages": ["tiny_pkg"]})
        assert not res.is_error, res
        assert res.structured_content is not None
        assert res.structured_content["status"] == "ok", res.structured_content
        res = await mcp.call_tool("python", {"code": "import tinypkg\ntinypkg.ANSWER"})
        assert res.structured_content is not None
        assert res.structured_content["value"] == 42, json.dumps(res.structured_content)
