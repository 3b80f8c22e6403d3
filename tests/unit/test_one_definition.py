"""The single definitions (a rule, message or limit spelled twice drifts apart): the rules module,
the result table and the error table."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import sandboxd
import sandboxd_client
from sandboxd.api.problems import PROBLEMS, _map
from sandboxd.errors import SandboxdError
from sandboxd.models import LIMIT_MESSAGES, Limits, Reason, Result, Status, status_for
from sandboxd.protocol.rules import OutputBudget, import_verdict


def _sources() -> list[tuple[Path, Path]]:
    """Every module of the daemon and of the thin client (whose agent loop waits too), with
    its package's directory."""
    roots = [Path(sandboxd.__file__).parent, Path(sandboxd_client.__file__).parent]
    return [(root, path) for root in roots for path in sorted(root.rglob("*.py"))]


def _all_errors() -> list[type[SandboxdError]]:
    for info in pkgutil.walk_packages(sandboxd.__path__, "sandboxd."):
        if ".client" in info.name or info.name.endswith("__main__"):
            continue
        importlib.import_module(info.name)
    found: list[type[SandboxdError]] = []
    todo = [SandboxdError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_problem_code_belongs_to_an_error() -> None:
    codes = {cls.code for cls in _all_errors()} | {"audit-storage-full"}
    assert set(PROBLEMS) <= codes, set(PROBLEMS) - codes


def test_every_daemon_error_class_has_a_code() -> None:
    """Its own, or its parent's when it is a variant of it (QueueFull is ``overloaded``)."""
    seen: dict[str, str] = {}
    for cls in _all_errors():
        if cls is SandboxdError:
            continue
        assert cls.code != SandboxdError.code, f"{cls.__qualname__} has no code"
        if "code" in vars(cls):
            assert cls.code not in seen, f"{cls.__qualname__} reuses {seen[cls.code]}'s code"
            seen[cls.code] = cls.__qualname__


def test_an_error_outside_the_table_shows_no_internals() -> None:
    class Secret(SandboxdError):
        code = "not-in-the-table"

    problem = _map(Secret("/etc/sandboxd/tokens.yaml: token sbx_abc"))
    assert (problem.status, problem.slug) == (500, "internal")
    assert "sbx_abc" not in problem.detail


@pytest.mark.parametrize("reason", list(LIMIT_MESSAGES))
def test_a_limit_reads_the_same_from_every_builder(reason: Reason) -> None:
    limits = Limits(timeout_s=7, memory_bytes=1 << 20, pids=9, output_bytes=4096)
    a = Result.build(("inv_a", "python", None), "restricted", reason, limits=limits)
    b = Result.build(("inv_b", "python", None), "container", reason, limits=limits)
    assert a.message == b.message and a.message
    assert a.status is status_for(reason) is not Status.ok


def test_import_rule_and_output_budget() -> None:
    assert import_verdict("os.path", ["os"], []) == (True, "allow[0]")
    assert import_verdict("os", ["os.path"], []) == (False, "allow")
    assert import_verdict("json", ["*"], ["json.tool"], ("tool",)) == (False, "deny[0]")
    assert import_verdict("math", [], []) == (False, "allow")
    assert import_verdict(".x", ["*"], []) == (False, "relative")
    budget = OutputBudget(10)
    assert budget.take(6) == 6 and not budget.exceeded
    assert budget.take(4) == 4 and not budget.exceeded  # exactly the cap is within it
    assert budget.take(1) == 0 and budget.exceeded


def test_every_time_limit_goes_through_sandboxd_deadline() -> None:
    """``asyncio.wait_for`` can swallow a cancellation on 3.11 (a cancelled container call
    once hung on it), and ``asyncio.timeout`` is the same rule written a second way: every
    time-limited wait in the package is :func:`sandboxd.util.deadline.within`."""
    found = []
    for root, path in _sources():
        if path.name == "deadline.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in {"wait_for", "timeout"} \
                    and isinstance(node.value, ast.Name) and node.value.id == "asyncio":
                found.append(f"{path.relative_to(root)}:{node.lineno} asyncio.{node.attr}")
    assert found == []


def test_every_task_is_stopped_through_sandboxd_deadline() -> None:
    """``task.cancel()`` then ``suppress(CancelledError): await task`` swallows the caller's
    own cancellation too: every task is stopped with :func:`sandboxd.util.deadline.stop_task`."""
    found = []
    for root, path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "suppress" \
                    and any(isinstance(a, ast.Attribute) and a.attr == "CancelledError"
                            for a in node.args):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert found == []
