"""The bash tool's decisions: every program its code names (in pipelines, lists, command
substitutions, function bodies, loops, ``case``, behind wrappers) checked against the shell
tool's ``commands.deny`` with that tool's rule and the position in the code; comments,
here-document bodies, quoted words and arguments are no programs; the plan names the programs
the kernel may execute (allowed and not denied)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxd.models import ToolKind
from sandboxd.policy.loader import load_file
from tests.policy.helpers import decide, store_for, write

TOOLS = """\
tools:
  shell:
    backend: container
    commands: {allow: [ls, echo, cat, curl], deny: [curl, nc, sudo]}
  bash:
    backend: container
"""


@pytest.mark.parametrize(("code", "rule", "where"), [
    ("ls\ncurl x", "tools.shell.commands.deny[0]", "line 2, column 1"),
    ("ls | nc h 1", "tools.shell.commands.deny[1]", "line 1, column 6"),
    ("echo \"$(sudo ls)\"", "tools.shell.commands.deny[2]", "line 1, column 9"),
    ("echo `nc x`", "tools.shell.commands.deny[1]", "line 1, column 7"),
    ("f() {\n  curl x\n}", "tools.shell.commands.deny[0]", "line 2, column 3"),
    ("for h in a b; do nc $h; done", "tools.shell.commands.deny[1]", "line 1, column 18"),
    ("case $x in a) sudo x;; esac", "tools.shell.commands.deny[2]", "line 1, column 15"),
    ("X=1 nice curl x", "tools.shell.commands.deny[0]", "line 1, column 5"),
    ("/usr/bin/curl x", "tools.shell.commands.deny[0]", "line 1, column 1"),
    ("if true; then { sudo x; }; fi", "tools.shell.commands.deny[2]", "line 1, column 17"),
])
def test_a_denied_program_anywhere_in_the_code_is_refused(tmp_path: Path, code: str,
                                                          rule: str, where: str) -> None:
    d = decide(store_for(tmp_path, TOOLS), "bash", {"code": code})
    assert not d.allowed and d.rule == rule, d
    assert where in (d.message or ""), d.message


@pytest.mark.parametrize("code", [
    "# curl x\necho 'curl' nc \"sudo\"",
    "cat <<EOF\ncurl x\nnc y\nEOF\nls",
    "echo curl; ls -l nc",
    "p=curl; echo $p",
    "[[ -n $x ]] && echo ok",
])
def test_words_that_are_no_programs_are_not_taken_for_them(tmp_path: Path, code: str) -> None:
    d = decide(store_for(tmp_path, TOOLS), "bash", {"code": code})
    assert d.allowed, d
    assert d.plan is not None and d.plan.kind is ToolKind.bash
    assert d.plan.programs == ("ls", "echo", "cat")  # what the kernel may execute


def test_bash_needs_the_shell_tools_commands(tmp_path: Path) -> None:
    p = write(tmp_path, "b.yaml", "version: 1\nname: b\nclients: ['*']\n"
                                  "tools:\n  bash:\n    backend: container\n")
    loaded, problems = load_file(p)
    assert loaded is None
    assert problems == [f"{p}:6:5: tools.bash: the bash tool runs what tools.shell.commands "
                        "allows: add a tools.shell block with the commands"], problems
