"""The ``same_on_every_host`` marker (CI's emulated VM job is slow, so
it runs only what a modern host can change): a test whose proof is the same on any
host leaves the modern-host VM job (tests/vm/README.md) and runs in ``make test`` only. Every
use says why, and the VM's pytest command is the one place that deselects it."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
SUITE = TESTS / "vm" / "guest" / "test-suite.sh"
MARK = "same_on_every_host"


def _uses(tree: ast.AST) -> list[tuple[int, ast.AST]]:
    """Every ``<...>.mark.same_on_every_host`` in ``tree``, with the node that uses it (the
    call, or the bare attribute when it is not called)."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    out: list[tuple[int, ast.AST]] = []
    for node in ast.walk(tree):
        call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == MARK
        bare = isinstance(node, ast.Attribute) and node.attr == MARK and id(node) not in called
        if call or bare:
            out.append((node.lineno, node))
    return out


def _reason(node: ast.AST) -> str:
    """The reason a use gives: its one positional argument, a string (else "")."""
    if not isinstance(node, ast.Call) or len(node.args) != 1 or node.keywords:
        return ""
    arg = node.args[0]
    return arg.value.strip() if isinstance(arg, ast.Constant) and isinstance(arg.value, str) \
        else ""


def _all_uses() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(__file__).resolve():
            continue
        for line, node in _uses(ast.parse(path.read_text(), str(path))):
            found.append((f"{path.relative_to(REPO)}:{line}", line, _reason(node)))
    return found


def test_every_use_gives_its_reason() -> None:
    uses = _all_uses()
    assert uses, "no test is marked; then the VM job deselects nothing and this rule is moot"
    missing = [where for where, _, reason in uses if len(reason) < 20]
    assert missing == [], f"{MARK} needs one string saying why the proof is the same: {missing}"


def test_the_rule_finds_a_use_without_a_reason() -> None:
    tree = ast.parse("import pytest\n"
                     "a = pytest.mark.same_on_every_host\n"
                     "b = pytest.mark.same_on_every_host('')\n"
                     "c = pytest.mark.same_on_every_host(reason='keyword, not the one argument')\n"
                     "d = pytest.mark.same_on_every_host("
                     "'the HTTP contract, nothing of the host')\n")
    assert [(line, _reason(node)) for line, node in sorted(_uses(tree), key=lambda u: u[0])] == [
        (2, ""), (3, ""), (4, ""), (5, "the HTTP contract, nothing of the host")]


def test_the_vm_pytest_command_deselects_it_and_make_test_does_not() -> None:
    text = SUITE.read_text()
    assert re.search(r'^marks=\$\{TEST_MARKS-not same_on_every_host\}$', text, re.M), text
    (command,) = [line for line in text.splitlines()
                  if re.search(r"\bpytest \$\{PYTEST_ARGS", line)]
    rest = text[text.index(command):].split("\n", 2)[1]  # its continuation line
    assert '"${mark_args[@]}"' in command + rest
    assert 'mark_args=(-m "$marks")' in text
    # the guest's default reaches pytest: the shell gives it exactly this -m expression
    shell = ("marks=${TEST_MARKS-not same_on_every_host}; mark_args=(); "
             '[ -n "$marks" ] && mark_args=(-m "$marks"); printf "%s\\n" "${mark_args[@]}"')
    run = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin"})
    assert run.stdout.splitlines() == ["-m", "not same_on_every_host"], run
    for where in ("Makefile", ".ci/run"):  # make test selects no marks away
        code = [line for line in (REPO / where).read_text().splitlines()
                if not line.lstrip().startswith("#")]
        assert not [line for line in code if MARK in line or "TEST_MARKS" in line], where


def test_the_marker_is_registered_with_its_reason() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert re.search(rf'"{MARK}\(reason\): [^"]*VM job deselects it, make test runs it', text)
