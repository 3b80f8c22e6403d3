"""Decisions: default deny, deny beats allow, limit capping, python imports, file paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxd.models import LimitsRequest, ToolKind
from tests.policy.helpers import decide, store_for

SHELL = """\
tools:
  shell:
    commands:
      allow: [ls, cat, echo, grep, curl]
      deny: [rm, wget, curl]
"""


def test_deny_beats_allow_and_names_the_rule(tmp_path: Path) -> None:
    store = store_for(tmp_path, SHELL)
    d = decide(store, "shell", {"command": "curl https://example.com"})
    assert not d.allowed
    assert d.rule == "tools.shell.commands.deny[2]"
    assert d.source == str(tmp_path / "policies" / "p.yaml")
    assert d.message.startswith("`curl` is not allowed here; allowed commands: ls, cat, echo, "
                                "grep.")
    assert "curl" not in d.message.split("allowed commands:")[1]
    assert d.limits is None and d.plan is None


def test_default_deny_for_unlisted_program_and_tool(tmp_path: Path) -> None:
    store = store_for(tmp_path, SHELL)
    d = decide(store, "shell", {"command": "python3 -c 1"})
    assert (d.allowed, d.rule) == (False, "tools.shell.commands.allow")
    d = decide(store, "python", {"code": "1"})
    assert (d.allowed, d.rule) == (False, "default_deny")
    assert d.message == "Tool `python` is not available here; available tools: shell."


def test_allowed_command_gets_argv_backend_and_limits(tmp_path: Path) -> None:
    store = store_for(tmp_path, SHELL)
    d = decide(store, "shell", {"command": "grep -n 'a b' \"c d\" e\\ f"})
    assert d.allowed
    assert d.rule == "tools.shell.commands.allow[3]"
    assert d.plan is not None and d.plan.argv == ["grep", "-n", "a b", "c d", "e f"]
    assert (d.backend, d.plan.kind, d.plan.network) == ("container", ToolKind.command, None)
    assert d.limits is not None and d.limits.network is False


def test_disabled_tool_is_denied_with_its_rule(tmp_path: Path) -> None:
    store = store_for(tmp_path, "tools:\n  shell: {enabled: false}\n  python: {}\n")
    d = decide(store, "shell", {"command": "ls"})
    assert (d.allowed, d.rule) == (False, "tools.shell.enabled")
    assert [t.name for t in store.tools_for("local")] == ["python"]


def test_clients_map_to_their_policy(tmp_path: Path) -> None:
    d = tmp_path / "policies"
    d.mkdir()
    (d / "a.yaml").write_text("version: 1\nname: a\nclients: [alice]\ntools: {python: {}}\n")
    (d / "b.yaml").write_text("version: 1\nname: b\nclients: [bob]\n"
                              "tools: {shell: {commands: {allow: [ls]}}}\n")
    from sandboxd.policy import PolicyStore

    store = PolicyStore(d)
    store.load()
    assert decide(store, "python", {"code": "1"}, client="alice").allowed
    assert not decide(store, "python", {"code": "1"}, client="bob").allowed
    assert decide(store, "shell", {"command": "ls"}, client="bob").policy_name == "b"
    nobody = decide(store, "shell", {"command": "ls"}, client="mallory")
    assert (nobody.allowed, nobody.rule) == (False, "clients")
    assert store.tools_for("mallory") == []


LIMITS = """\
limits: {timeout: 60s, max_timeout: 120s, memory: 256Mi, max_memory: 512Mi, cpus: 1,
         pids: 64, output: 1Mi}
tools:
  python:
    limits: {timeout: 200s, memory: 128Mi, max_pids: 10}
  shell:
    commands: {allow: [ls]}
"""


def test_limits_are_min_of_request_tool_and_policy_max(tmp_path: Path) -> None:
    store = store_for(tmp_path, LIMITS)
    d = decide(store, "python", {"code": "1"})
    assert d.limits is not None
    # the tool asks 200s but the policy maximum is 120s; tool memory 128Mi; pids capped to 10
    assert d.limits.timeout_s == 120
    assert d.limits.memory_bytes == 128 * 1024**2
    assert d.limits.pids == 10
    assert d.limits.cpus == 1.0 and d.limits.output_bytes == 1024**2
    # a request can lower limits ...
    d = decide(store, "python", {"code": "1"},
               limits=LimitsRequest(timeout_s=5, memory_bytes=64 * 1024**2, pids=3))
    assert d.limits is not None
    assert (d.limits.timeout_s, d.limits.memory_bytes, d.limits.pids) == (5, 64 * 1024**2, 3)
    # ... never raise them
    d = decide(store, "python", {"code": "1"},
               limits=LimitsRequest(timeout_s=10_000, memory_bytes=10 * 1024**3, cpus=64,
                                    pids=10_000, output_bytes=10**12))
    assert d.limits is not None
    assert d.limits.timeout_s == 120 and d.limits.memory_bytes == 128 * 1024**2
    assert d.limits.cpus == 1.0 and d.limits.pids == 10 and d.limits.output_bytes == 1024**2
    # the shell has no tool limits: the policy defaults apply
    d = decide(store, "shell", {"command": "ls"})
    assert d.limits is not None
    assert (d.limits.timeout_s, d.limits.memory_bytes, d.limits.pids) == (60, 256 * 1024**2, 64)


PYTHON = """\
tools:
  python:
    backend: container  # the restricted backend offers no os (a policy check error there)
    imports:
      allow: [math, json, os.path, collections]
      deny: [os, json.tool]
"""


@pytest.mark.parametrize(("code", "allowed", "rule"), [
    ("import math\nmath.sqrt(2)", True, "tools.python"),
    ("import json, collections.abc", True, "tools.python"),
    ("import os", False, "tools.python.imports.deny[0]"),
    ("import os.path", False, "tools.python.imports.deny[0]"),  # deny beats allow
    ("from json import tool", False, "tools.python.imports.deny[1]"),
    ("import json.tool", False, "tools.python.imports.deny[1]"),
    ("import socket", False, "tools.python.imports.allow"),
    ("def f():\n    import subprocess\n", False, "tools.python.imports.allow"),
    ("__import__('ctypes')", False, "tools.python.imports.allow"),
    ("from . import x", False, "tools.python.imports"),
    ("this is not python", True, "tools.python"),  # the backend reports the syntax error
])
def test_python_imports(tmp_path: Path, code: str, allowed: bool, rule: str) -> None:
    store = store_for(tmp_path, PYTHON)
    d = decide(store, "python", {"code": code})
    assert (d.allowed, d.rule) == (allowed, rule)
    if not allowed:
        assert "is not allowed here; allowed modules: math, json, os.path, collections" in (
            d.message) or "Relative imports" in d.message
    else:
        assert d.plan is not None
        assert d.plan.imports_allow == ("math", "json", "os.path", "collections")
        assert d.plan.imports_deny == ("os", "json.tool")
        assert (d.backend, d.plan.kind) == ("container", ToolKind.python)


FILES = """\
tools:
  read_file:
    paths:
      allow: ["**"]
      deny: ["**/.env", "secrets/**", "*.key"]
    max_bytes: 1Ki
  write_file:
    paths:
      allow: ["out/*.txt"]
    max_bytes: 10
  list_files:
    paths:
      allow: ["**"]
"""


@pytest.mark.parametrize(("tool", "args", "allowed", "rule"), [
    ("read_file", {"path": "a/b.txt"}, True, "tools.read_file.paths.allow[0]"),
    ("read_file", {"path": ".env"}, False, "tools.read_file.paths.deny[0]"),
    ("read_file", {"path": "deep/er/.env"}, False, "tools.read_file.paths.deny[0]"),
    ("read_file", {"path": "./secrets//x"}, False, "tools.read_file.paths.deny[1]"),
    ("read_file", {"path": "a.key"}, False, "tools.read_file.paths.deny[2]"),
    ("read_file", {"path": "sub/a.key"}, True, "tools.read_file.paths.allow[0]"),
    ("read_file", {"path": "../etc/passwd"}, False, "tools.read_file.paths"),
    ("read_file", {"path": "a/../../b"}, False, "tools.read_file.paths"),
    ("read_file", {"path": "/etc/passwd"}, False, "tools.read_file.paths"),
    ("read_file", {"path": "a\x00b"}, False, "tools.read_file.paths"),
    ("write_file", {"path": "out/x.txt", "content": "short"}, True,
     "tools.write_file.paths.allow[0]"),
    ("write_file", {"path": "out/sub/x.txt", "content": ""}, False, "tools.write_file.paths.allow"),
    ("write_file", {"path": "x.txt", "content": ""}, False, "tools.write_file.paths.allow"),
    ("write_file", {"path": "out/x.txt", "content": "much too long"}, False,
     "tools.write_file.max_bytes"),
    ("list_files", {}, True, "tools.list_files.paths.allow[0]"),
    ("list_files", {"path": "."}, True, "tools.list_files.paths.allow[0]"),
])
def test_file_paths(tmp_path: Path, tool: str, args: dict, allowed: bool, rule: str) -> None:
    store = store_for(tmp_path, FILES)
    d = decide(store, tool, args)
    assert (d.allowed, d.rule) == (allowed, rule), d.message
    assert d.backend == "workspace"
    if tool == "read_file" and allowed:  # a denial runs nothing: it has no plan
        assert d.plan is not None and d.plan.max_file_bytes == 1024
    if not allowed:
        assert d.message


def test_tool_descriptions_tell_the_model_what_is_allowed(tmp_path: Path) -> None:
    store = store_for(tmp_path, SHELL + PYTHON.removeprefix("tools:\n"))
    specs = {t.name: t for t in store.tools_for("local")}
    assert "Allowed commands: ls, cat, echo, grep." in specs["shell"].description
    assert "Allowed imports: math, json, os.path, collections." in specs["python"].description
    assert specs["shell"].openai()["function"]["parameters"]["required"] == ["command"]
    assert all(t.available for t in specs.values())


OPEN_FILES = """\
limits: {open_files: 100, max_open_files: 200}
tools:
  python:
    limits: {max_open_files: 150}
  shell:
    commands: {allow: [ls]}
"""


def test_open_files_default_maximum_and_request(tmp_path: Path) -> None:
    """``open_files`` (the limit that proves a new one needs only a row in the
    limits table): a policy default and maximum,
    a tool maximum, a request that lowers it; the built-in default without a policy value."""
    store = store_for(tmp_path, OPEN_FILES)
    d = decide(store, "python", {"code": "1"})
    assert d.limits is not None and d.limits.open_files == 100
    d = decide(store, "python", {"code": "1"}, limits=LimitsRequest(open_files=32))
    assert d.limits is not None and d.limits.open_files == 32
    d = decide(store, "python", {"code": "1"}, limits=LimitsRequest(open_files=1000))
    assert d.limits is not None and d.limits.open_files == 100  # never raised
    assert d.limits.rlimits() == {"RLIMIT_NOFILE": 100}
    store = store_for(tmp_path / "plain", LIMITS)
    d = decide(store, "python", {"code": "1"})
    assert d.limits is not None and d.limits.open_files == 64


def test_open_files_out_of_bounds_is_a_policy_error(tmp_path: Path) -> None:
    from sandboxd.policy import PolicyError

    with pytest.raises(PolicyError, match="open_files must be between 16 and 1024"):
        store_for(tmp_path, "limits: {open_files: 4096}\ntools: {python: {}}\n")
