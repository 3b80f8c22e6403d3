"""One table of rule cases (imports, workspace paths, output sizes) through every enforcement
point, over HTTP: the policy engine (``POST /v1/policy/explain``), the restricted backend and
the container backend (real daemon, real Docker, the image under test). Every point must reach
the same decision (:mod:`sandboxd.protocol.rules` is the one definition they all use).

One daemon serves every case: each import rule set is a pair of policies (python on the
restricted backend for client ``r-<set>``, in a container for ``c-<set>``), reached with that
client's token. Imports are tried twice in the container: as written (the engine decides
first) and hidden from the engine (``__import__`` of a computed name: only the runner's own
import rule decides).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd.access.tokens import add_token
from tests.support.daemon import RunningDaemon, running_daemon

#: import rule sets: name -> (allow, deny)
RULES: dict[str, tuple[list[str], list[str]]] = {
    "star": (["*"], []),
    "star-deny": (["*"], ["collections", "json.tool"]),
    "list": (["math", "json", "collections", "string"], ["json.tool", "collections.abc"]),
    "sub": (["collections.abc", "math"], ["math"]),
    "none": ([], []),
}

#: (rule set, module, from-list, admitted)
IMPORTS: list[tuple[str, str, tuple[str, ...], bool]] = [
    ("star", "math", (), True),
    ("star", "json", (), True),
    ("star", "collections.abc", (), True),
    ("star", "string", ("ascii_letters",), True),
    ("star-deny", "math", (), True),
    ("star-deny", "collections", (), False),
    ("star-deny", "collections.abc", (), False),
    ("star-deny", "json", (), True),
    ("star-deny", "json", ("tool",), False),
    ("star-deny", "json.tool", (), False),
    ("list", "math", (), True),
    ("list", "json", ("dumps",), True),
    ("list", "json.decoder", (), True),
    ("list", "json.tool", (), False),
    ("list", "collections", ("abc",), False),
    ("list", "collections", ("OrderedDict",), True),
    ("list", "random", (), False),
    ("list", "string", (), True),
    ("sub", "collections", (), False),
    ("sub", "collections.abc", (), True),
    ("sub", "math", (), False),
    ("none", "math", (), False),
    ("none", "json", (), False),
]

#: (path, admitted): the workspace path rule (files are written under an existing "d/")
PATHS: list[tuple[str, bool]] = [
    ("a.txt", True),
    ("./b.txt", True),
    ("d//c.txt", True),
    ("d/./e.txt", True),
    ("/workspace/f.txt", True),
    ("/workspace/d/g.txt", True),
    ("/workspace/./h.txt", True),
    ("/etc/passwd", False),
    ("/tmp/x.txt", False),
    ("/workspacex/i.txt", False),
    ("../j.txt", False),
    ("d/../k.txt", False),
    ("/workspace/../l.txt", False),
    ("m.txt ", False),
    (" n.txt", False),
    ("e\u0301.txt", False),
    ("o\u202etxt.exe", False),
    ("p\u00a0.txt", False),
]

#: (output cap in bytes, stdout bytes, stderr message bytes (0: no error), over the cap)
OUTPUTS: list[tuple[int, int, int, bool]] = [
    (1000, 10, 0, False),
    (1000, 1000, 0, False),
    (1000, 1001, 0, True),
    (1000, 5000, 0, True),
    (4096, 3000, 2000, True),
    (4096, 100, 8000, True),
    (65536, 30000, 30000, False),
    (65536, 40000, 30000, True),
]

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = pytest.mark.same_on_every_host(
    "one rule table's decisions at every enforcement point (sandboxd.protocol.rules): the same "
    "on any host; the confinement behind the points is tests/security's in the VM")

FILE_TOOLS = """
  write_file: {paths: {allow: ["**"]}, max_bytes: 1Mi}
  read_file: {paths: {allow: ["**"]}, max_bytes: 1Mi}
  shell:
    backend: container
    commands: {allow: [echo]}
    operators: true
"""


def _policy(name: str, client: str, backend: str, allow: list[str], deny: list[str]) -> str:
    return (f"version: 1\nname: {name}\nclients: [{client}]\n"
            "limits: {timeout: 30s, max_timeout: 60s, memory: 256Mi, output: 1Mi}\n"
            "tools:\n  python:\n"
            f"    backend: {backend}\n"
            f"    imports: {{allow: {json.dumps(allow)}, deny: {json.dumps(deny)}}}\n"
            + FILE_TOOLS)


class Clients:
    """The one daemon and a header per client."""

    def __init__(self, daemon: RunningDaemon, tokens: dict[str, str]) -> None:
        self.daemon = daemon
        self.tokens = tokens
        self.sessions: dict[str, str] = {}

    def post(self, client: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        r = self.daemon.client.post(path, json=body,
                                    headers={"Authorization": f"Bearer {self.tokens[client]}"})
        assert r.status_code in (200, 201), r.text
        return r.json()

    def explain(self, client: str, tool: str, arguments: dict[str, Any],
                limits: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"tool": tool, "arguments": arguments}
        if limits:
            body["limits"] = limits
        return self.post(client, "/v1/policy/explain", body)

    def invoke(self, client: str, tool: str, arguments: dict[str, Any],
               limits: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"arguments": arguments, "session": self.sessions[client]}
        if limits:
            body["limits"] = limits
        return self.post(client, f"/v1/tools/{tool}/invoke", body)


@pytest.fixture(scope="module")
def clients(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clients]:
    tmp = tmp_path_factory.mktemp("parity")
    policies = tmp / "policies"
    policies.mkdir()
    tokens_file = tmp / "tokens.yaml"
    tokens: dict[str, str] = {}
    for name, (allow, deny) in RULES.items():
        for prefix, backend in (("r", "restricted"), ("c", "container")):
            client = f"{prefix}-{name}"
            (policies / f"{client}.yaml").write_text(
                _policy(f"p-{client}", client, backend, allow, deny))
            tokens[client] = add_token(tokens_file, client)
    env = {"SANDBOXD_TOKENS_FILE": str(tokens_file),
           "SANDBOXD_INSTANCE": f"parity{secrets.token_hex(4)}",
           "SANDBOXD_WARM_POOL_SIZE": "1"}
    for name in ("SANDBOXD_PYTHON_IMAGE", "SANDBOXD_SHELL_IMAGE"):  # the image under test
        if name in os.environ:
            env[name] = os.environ[name]
    with running_daemon(tmp, policies_dir=policies, env=env) as daemon:
        c = Clients(daemon, tokens)
        for client in tokens:  # a session per client, whose workspace has the directory "d"
            c.sessions[client] = c.post(client, "/v1/sessions", None)["id"]
            made = c.invoke(client, "write_file", {"path": "d/.keep", "content": ""})
            assert made["status"] == "ok", made
        yield c


# ------------------------------------------------------------------ imports


def _import_code(module: str, fromlist: tuple[str, ...]) -> str:
    if fromlist:
        return f"from {module} import {', '.join(fromlist)}\nprint('imported')"
    return f"import {module}\nprint('imported')"


def _hidden_import_code(module: str, fromlist: tuple[str, ...]) -> str:
    """The same import with a name the engine cannot see (only the runner decides)."""
    reversed_name = module[::-1]
    return (f"name = {reversed_name!r}[::-1]\n"
            f"__import__(name, globals(), None, {list(fromlist)!r}, 0)\n"
            "print('imported')")


def _admitted(result: dict[str, Any]) -> bool:
    """Whether a python call got past every import rule (engine and backend)."""
    if result["status"] == "denied":
        return False
    if result["status"] == "ok" and result["stdout"] == "imported\n":
        return True
    text = result["stderr"] + (result.get("message") or "")
    assert "ImportError" in text or "not allowed by the policy" in text, result
    # the restricted backend's own refusal, or a module allowed but not offered there
    return "not allowed by the policy" not in text


@pytest.mark.parametrize(("rules", "module", "fromlist", "admitted"), IMPORTS,
                         ids=[f"{r}:{m}{':' + ','.join(f) if f else ''}"
                              for r, m, f, _ in IMPORTS])
def test_imports(clients: Clients, rules: str, module: str, fromlist: tuple[str, ...],
                 admitted: bool) -> None:
    code = _import_code(module, fromlist)
    engine = clients.explain(f"r-{rules}", "python", {"code": code})
    assert engine["allowed"] is admitted, engine
    container_engine = clients.explain(f"c-{rules}", "python", {"code": code})
    assert container_engine["allowed"] == engine["allowed"], container_engine
    restricted = clients.invoke(f"r-{rules}", "python", {"code": code})
    assert _admitted(restricted) is admitted, restricted
    container = clients.invoke(f"c-{rules}", "python", {"code": code})
    assert _admitted(container) is admitted, container
    hidden = clients.invoke(f"c-{rules}", "python", {"code": _hidden_import_code(module,
                                                                                fromlist)})
    assert hidden["status"] != "denied", hidden  # the engine saw no import
    assert _admitted(hidden) is admitted, hidden


# ------------------------------------------------------------------ workspace paths


@pytest.mark.parametrize(("path", "admitted"), PATHS, ids=[ascii(p) for p, _ in PATHS])
def test_paths(clients: Clients, path: str, admitted: bool) -> None:
    engine = clients.explain("r-star", "write_file", {"path": path, "content": "x"})
    assert engine["allowed"] is admitted, engine
    # the file tools (the workspace backend) of a daemon with each python backend
    for client in ("r-star", "c-star"):
        written = clients.invoke(client, "write_file", {"path": path, "content": "x"})
        assert (written["status"] == "ok") is admitted, written
    # the restricted backend's open()
    code = f"with open({path!r}, 'w') as f:\n    f.write('x')\nprint('written')"
    restricted = clients.invoke("r-star", "python", {"code": code})
    if admitted:
        assert restricted["status"] == "ok" and restricted["stdout"] == "written\n", restricted
    else:
        assert restricted["status"] == "error", restricted
        assert "SandboxViolation: open()" in restricted["stderr"], restricted  # refused
    # a redirect in the container (decided by the engine, opened by the runner)
    shell = clients.invoke("c-star", "shell", {"command": f"echo x > {shlex.quote(path)}"})
    assert (shell["status"] == "ok") is admitted, shell


# ------------------------------------------------------------------ output


def _output_code(stdout_bytes: int, stderr_bytes: int) -> str:
    code = f"print('a' * {stdout_bytes}, end='')\n"
    if stderr_bytes:
        code += f"raise ValueError('b' * {stderr_bytes})\n"
    return code


@pytest.mark.parametrize(("cap", "out", "err", "over"), OUTPUTS,
                         ids=[f"cap{c}-out{o}-err{e}" for c, o, e, _ in OUTPUTS])
def test_output(clients: Clients, cap: int, out: int, err: int, over: bool) -> None:
    limits = {"output_bytes": cap}
    code = _output_code(out, err)
    engine = clients.explain("r-star", "python", {"code": code}, limits)
    assert engine["allowed"] and engine["limits"]["output_bytes"] == cap, engine
    seen = {}
    for client in ("r-star", "c-star"):
        result = clients.invoke(client, "python", {"code": code}, limits)
        total = len(result["stdout"].encode()) + len(result["stderr"].encode())
        assert total <= cap, result
        reason = result["termination"]["reason"]
        assert (reason == "output_limit") is over, (client, result)
        if over:
            assert result["status"] == "killed", result
            assert result["truncated"]["stdout"] or result["truncated"]["stderr"], result
        if not err:  # one stream: exactly what fits of it is kept
            assert result["stdout"] == "a" * min(out, cap), result
        # (with two streams, which one the container's runner reads first is up to the
        # scheduler; the cap holds for their sum either way)
        seen[client] = (result["status"], reason)
    assert seen["r-star"] == seen["c-star"], seen


def test_the_table_is_large_enough() -> None:
    assert len(IMPORTS) + len(PATHS) + len(OUTPUTS) >= 40
    assert Path(__file__).parent.name == "parity"
