"""The shell tool's ``env``: added to each planned command's environment, bounded, names the
confinement relies on refused (:mod:`sandboxd.protocol.environment`), and never for a program
sandboxd hardens (as ``env NAME=value git`` is refused)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxd.protocol.environment import MAX_VALUE_BYTES, MAX_VARS
from tests.policy.helpers import decide, store_for

SHELL = """\
tools:
  shell:
    operators: true
    commands:
      allow: [echo, printenv, git]
"""


def test_env_reaches_every_planned_command(tmp_path: Path) -> None:
    store = store_for(tmp_path, SHELL)
    d = decide(store, "shell", {"command": "printenv A | echo x", "env": {"A": "1"}})
    assert d.allowed and d.plan is not None and d.plan.command is not None
    envs = [c.env for p in d.plan.command.pipelines for c in p.commands]
    assert envs == [{"A": "1"}, {"A": "1"}]


@pytest.mark.parametrize(("env", "says"), [
    ({"PATH": "/workspace"}, "PATH may not be set"),
    ({"LD_PRELOAD": "/workspace/x.so"}, "LD_PRELOAD may not be set"),
    ({"ld_audit": "x"}, "ld_audit may not be set"),
    ({"no_proxy": "*"}, "no_proxy may not be set"),
    ({"BASH_ENV": "x"}, "BASH_ENV may not be set"),
    ({"A-B": "x"}, "not a variable name"),
    ({"A": "x\x00"}, "without NUL"),
    ({"A": "x" * (MAX_VALUE_BYTES + 1)}, f"at most {MAX_VALUE_BYTES} bytes"),
    ({f"V{i}": "" for i in range(MAX_VARS + 1)}, f"at most {MAX_VARS}"),
])
def test_refused_env(tmp_path: Path, env: dict[str, str], says: str) -> None:
    d = decide(store_for(tmp_path, SHELL), "shell", {"command": "printenv", "env": env})
    assert not d.allowed and d.rule == "tools.shell"
    assert says in d.message


def test_a_hardened_programs_environment_is_not_changed(tmp_path: Path) -> None:
    store = store_for(tmp_path, SHELL)
    assert decide(store, "shell", {"command": "git status"}).allowed
    d = decide(store, "shell", {"command": "git status", "env": {"GIT_DIR": "/tmp"}})
    assert not d.allowed and "environment of `git`" in d.message
