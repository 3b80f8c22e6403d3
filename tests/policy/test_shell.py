"""The shell tool: operators refused unless enabled, then every command checked, and the
checked structure is what the backend receives (a plan, never a shell string)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.policy.helpers import decide, store_for

RULES = """\
tools:
  shell:
    commands:
      allow: [ls, cat, grep, wc, echo, sort, env, timeout]
      deny: [curl, sh, bash]
    operators: {operators}
    deny_patterns: ['--upload-pack']
"""


@pytest.mark.parametrize("line", [
    "ls | wc -l",
    "ls; cat x",
    "ls && cat x",
    "ls || cat x",
    "ls > out.txt",
    "cat < in.txt",
    "ls 2>err",
    "ls &",
    "echo $(id)",
    'echo "$(id)"',
    "echo `id`",
    "ls\ncat x",
    "cat <(ls)",
])
def test_operators_refused_by_default(tmp_path: Path, line: str) -> None:
    store = store_for(tmp_path, RULES.format(operators="false"))
    d = decide(store, "shell", {"command": line})
    assert (d.allowed, d.rule) == (False, "tools.shell.operators"), d.message
    assert "not allowed here" in d.message
    assert "run a single program per call" in d.message


@pytest.mark.parametrize(("line", "argv"), [
    ("echo 'a | b; c && d > e'", ["echo", "a | b; c && d > e"]),
    ("echo '$(id)' '`x`'", ["echo", "$(id)", "`x`"]),
    ('echo "a;b" c\\;d', ["echo", "a;b", "c;d"]),
    ("grep -e 'x y' $HOME *.py", ["grep", "-e", "x y", "$HOME", "*.py"]),  # no shell: literal
    ("/usr/bin/ls -l", ["/usr/bin/ls", "-l"]),
])
def test_quoted_operators_are_plain_arguments(tmp_path: Path, line: str, argv: list[str]) -> None:
    store = store_for(tmp_path, RULES.format(operators="false"))
    d = decide(store, "shell", {"command": line})
    assert d.allowed, d.message
    assert d.plan.argv == argv


@pytest.mark.parametrize(("line", "rule"), [
    ("./ls", "tools.shell.commands.allow"),
    ("/tmp/ls", "tools.shell.commands.allow"),
    ("/usr/bin/curl x", "tools.shell.commands.deny[0]"),
    ("/usr/bin/../bin/curl x", "tools.shell.commands.deny[0]"),
    ("c'u'rl x", "tools.shell.commands.deny[0]"),  # quote removal like the shell
    ("FOO=1 ls", "tools.shell.commands.allow"),
    ("env curl x", "tools.shell.commands.deny[0]"),  # wrapped programs are checked too
    ("env A=1 -i curl x", "tools.shell.commands.deny[0]"),
    ("timeout 5 python3 -c 1", "tools.shell.commands.allow"),
    ("ls --upload-pack=x", "tools.shell.deny_patterns[0]"),
    ("echo 'unterminated", "tools.shell"),
])
def test_program_resolution(tmp_path: Path, line: str, rule: str) -> None:
    store = store_for(tmp_path, RULES.format(operators="false"))
    d = decide(store, "shell", {"command": line})
    assert (d.allowed, d.rule) == (False, rule), d.message


def test_wrapper_of_allowed_program_is_allowed(tmp_path: Path) -> None:
    store = store_for(tmp_path, RULES.format(operators="false"))
    d = decide(store, "shell", {"command": "timeout 5 ls -l"})
    assert d.allowed and d.rule == "tools.shell.commands.allow[7]"
    assert d.plan.argv == ["timeout", "5", "ls", "-l"]


@pytest.mark.parametrize(("line", "rule"), [
    ("ls | wc -l", "tools.shell.commands.allow[0], tools.shell.commands.allow[3]"),
    ("ls -l > out.txt 2>&1; cat out.txt | sort",
     "tools.shell.commands.allow[0], tools.shell.commands.allow[1], "
     "tools.shell.commands.allow[5]"),
    ("cat a && echo ok || echo failed\n", "tools.shell.commands.allow[1], "
     "tools.shell.commands.allow[4]"),
])
def test_operators_enabled_every_command_allowed(tmp_path: Path, line: str, rule: str) -> None:
    store = store_for(tmp_path, RULES.format(operators="true"))
    d = decide(store, "shell", {"command": line})
    assert d.allowed, d.message
    assert d.rule == rule
    assert d.plan is not None and d.plan.argv is None  # several commands: no single argv


def test_the_plan_is_the_parsed_line(tmp_path: Path) -> None:
    store = store_for(tmp_path, RULES.format(operators="true"))
    d = decide(store, "shell", {"command": "ls -l >out.txt 2>&1; cat 'a b' <in |\n sort -r "
                                           "&& echo ok || echo 'fail;ed' 2>/dev/null"})
    assert d.allowed and d.plan is not None, d.message
    assert d.plan.command is not None
    plan = _without_defaults(d.plan.command.to_wire())
    assert plan == {"pipelines": [
        {"commands": [{"argv": ["ls", "-l"], "redirects": [
            {"fd": 1, "mode": "write", "path": "out.txt"}, {"fd": 2, "mode": "dup", "dup": 1}]}]},
        {"commands": [{"argv": ["cat", "a b"],
                       "redirects": [{"fd": 0, "mode": "read", "path": "in"}]},
                      {"argv": ["sort", "-r"]}]},
        {"run_if": "ok", "commands": [{"argv": ["echo", "ok"]}]},
        {"run_if": "failed", "commands": [{"argv": ["echo", "fail;ed"], "redirects": [
            {"fd": 2, "mode": "write", "path": "/dev/null"}]}]},
    ]}


def _without_defaults(value: Any) -> Any:
    """A plan's wire form without the values that are each field's default."""
    defaults = {"run_if": "always", "env": {}, "exec_only": None, "redirects": [],
                "path": None, "dup": None}
    if isinstance(value, list):
        return [_without_defaults(v) for v in value]
    if isinstance(value, dict):
        return {k: _without_defaults(v) for k, v in value.items()
                if k not in defaults or v != defaults[k]}
    return value


@pytest.mark.parametrize(("line", "rule", "fragment"), [
    ("ls | curl -d @- x", "tools.shell.commands.deny[0]", "`curl` is not allowed"),
    ("ls; python3 x.py", "tools.shell.commands.allow", "`python3` is not allowed"),
    ("cat x && bash -c id", "tools.shell.commands.deny[2]", "`bash`"),
    ("X=curl; ls", "tools.shell.commands.allow", "Variable assignments"),
    ("ls |", "tools.shell.operators", "ends with an operator"),
    ("| ls", "tools.shell.operators", "Syntax error"),
    ("ls >", "tools.shell.operators", "needs a target"),
    ("ls; > x", "tools.shell.operators", "A redirect needs a command"),
    ("ls > /etc/passwd", "tools.shell.operators", "Redirects may name files in the workspace"),
    ("ls > ../x", "tools.shell.operators", "must not contain '..'"),
    ("ls >&x", "tools.shell.operators", "must be followed by a descriptor"),
    # every construct /bin/sh would read differently from this parser is refused, with a
    # message saying what to write instead (the lines a POSIX tokenizer and /bin/sh read differently
    # first)
    ("true #'\nid\n#'", "tools.shell.operators", "Comments (`#`)"),
    ("echo \"${x#\"'\"}\"; id #'", "tools.shell.operators", "`$` expansions"),
    ("ls > x; $X", "tools.shell.operators", "`$` expansions"),
    ("echo \"$HOME\"", "tools.shell.operators", "`$` expansions"),
    ("echo $((1+1))", "tools.shell.operators", "Arithmetic expansion"),
    ("echo $(curl x)", "tools.shell.operators", "Command substitution"),
    ("echo \"`curl x`\"", "tools.shell.operators", "Command substitution"),
    ("ls; l? x", "tools.shell.operators", "Globs (`?`)"),
    ("cat *.txt", "tools.shell.operators", "Globs (`*`)"),
    ("cat [ab]", "tools.shell.operators", "Globs (`[`)"),
    ("echo {a,b}", "tools.shell.operators", "Braces"),
    ("{ ls; }", "tools.shell.operators", "Braces"),
    ("cat ~/x", "tools.shell.operators", "`~` is not expanded"),
    ("ls & curl x", "tools.shell.operators", "Background jobs"),
    ("(curl x)", "tools.shell.operators", "Subshells"),
    ("cat <<EOF\ncurl\nEOF", "tools.shell.operators", "Here-documents"),
    ("cat <<<x", "tools.shell.operators", "Here-documents"),
    ("ls &> x", "tools.shell.operators", "`&>`"),
    ("ls |& cat", "tools.shell.operators", "`|&`"),
    ("ls 12>x", "tools.shell.operators", "descriptors above 9"),
    ("! ls", "tools.shell.operators", "Shell keywords such as `!`"),
    ("if ls; then cat x; fi", "tools.shell.operators", "Shell keywords such as `if`"),
    ("for x in a; do ls; done", "tools.shell.operators", "Shell keywords such as `for`"),
    ("cat <(ls)", "tools.shell.operators", "Process substitution"),
])
def test_operators_enabled_each_command_checked(tmp_path: Path, line: str, rule: str,
                                                fragment: str) -> None:
    store = store_for(tmp_path, RULES.format(operators="true"))
    d = decide(store, "shell", {"command": line})
    assert (d.allowed, d.rule) == (False, rule), d.message
    assert fragment in d.message
