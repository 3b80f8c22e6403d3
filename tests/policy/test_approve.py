"""The ``approve:`` key: loaded through the policy loader (errors at file:line:col), decided
by the engine (a tool, a shell command pattern, a package install), shown by ``policy
explain``."""

from __future__ import annotations

import json
from pathlib import Path

from sandboxd.policy import load_file
from tests.policy.helpers import decide, store_for, write
from tests.support import cli

GATED = """\
tools:
  python:
    backend: container
    packages:
      allow: [requests]
      approve: {by: [lead]}
  shell:
    backend: container
    commands: {allow: [git, ls]}
    approve: {by: [lead, ops], approval_timeout_s: 60, patterns: ['^git\\s+push\\b']}
  read_file:
    paths: {allow: ["**"]}
    approve: {elicit: true}
"""


def test_bad_approve_blocks_point_at_their_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.yaml", """\
        version: 1
        name: bad
        clients: [alice]
        tools:
          python:
            approve: {elicit: false}
            packages:
              allow: [requests]
              approve: {by: [lead], patterns: ["x"]}
          shell:
            approve: {by: [lead], approval_timeout_s: 0, patterns: ["("], who: [x]}
        """)
    policy, problems = load_file(path, str(path))
    assert policy is None
    text = "\n".join(problems)
    assert f"{path}:6:14: tools.python.approve.by: nobody may approve" in text
    assert (f"{path}:9:39: tools.python.packages.approve.patterns: 'patterns' is only "
            "meaningful under tools.shell.approve") in text
    assert (f"{path}:11:47: tools.shell.approve.approval_timeout_s: Input should be greater "
            "than 0") in text
    assert f"{path}:11:61: tools.shell.approve.patterns[0]: invalid regular expression" in text
    assert f"{path}:11:67: tools.shell.approve: unknown key 'who' (expected one of: by," in text


def test_what_needs_approval(tmp_path: Path) -> None:
    store = store_for(tmp_path, GATED)
    push = decide(store, "shell", {"command": "git push origin main"})
    assert push.allowed and push.approve is not None
    assert (push.approve.rule, push.approve.by, push.approve.timeout_s, push.approve.elicit) == (
        "tools.shell.approve.patterns[0]", ["lead", "ops"], 60.0, False)
    # a command no pattern matches runs at once; a denied one is never sent for approval
    assert decide(store, "shell", {"command": "git status"}).approve is None
    denied = decide(store, "shell", {"command": "rm -rf / ; git push"})
    assert not denied.allowed and denied.approve is None
    install = decide(store, "install_packages", {"packages": ["requests"]})
    assert install.allowed and install.approve is not None
    assert install.approve.rule == "tools.python.packages.approve"
    assert decide(store, "python", {"code": "print(1)"}).approve is None
    read = decide(store, "read_file", {"path": "a.txt"})
    assert read.approve is not None and read.approve.elicit and read.approve.by == []


def test_explain_says_a_call_needs_approval(tmp_path: Path) -> None:
    store_for(tmp_path, GATED)
    env = {"PATH": "/usr/bin:/bin", "SANDBOXD_CONFIG": "/nonexistent"}
    args = ("policy", "explain", "--policies", str(tmp_path / "policies"), "--tool", "shell",
            "--args", json.dumps({"command": "git push origin main"}))
    r = cli.run(*args, env=env)
    assert r.returncode == 0, r.stderr
    assert ("approval: needed (tools.shell.approve.patterns[0]): waits up to 60 s for "
            "lead, ops\n") in r.stdout
    out = json.loads(cli.run(*args, "--json", env=env).stdout)
    assert out["approve"] == {"rule": "tools.shell.approve.patterns[0]", "by": ["lead", "ops"],
                              "elicit": False, "timeout_s": 60.0}
