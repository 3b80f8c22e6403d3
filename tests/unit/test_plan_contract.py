"""The execution plan and the command plan of :mod:`sandboxd.protocol.plan`: the wire form the
container runner reads (``req["plan"]``) is byte for byte what the pydantic models of
``sandboxd.plans`` produced (``data/plan_wire.json`` was written by them, from the policy's
own plans of the calls it lists), and ``from_wire`` refuses what is not a plan, bounded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sandboxd.protocol.display import DisplayCaps
from sandboxd.protocol.limits import Limits
from sandboxd.protocol.plan import (
    MAX_REDIRECTS,
    MAX_TEXT,
    ExecutionPlan,
    Plan,
    PlannedCommand,
    Redirect,
    ToolKind,
)
from tests.policy.helpers import decide, store_for
from tests.policy.test_custom_tools import CUSTOM
from tests.policy.test_shell import RULES

WIRE = json.loads((Path(__file__).parent / "data" / "plan_wire.json").read_text("utf-8"))


@pytest.mark.parametrize("case", WIRE, ids=lambda c: json.dumps(c["call"])[:60])
def test_the_runner_receives_the_same_bytes(tmp_path: Path, case: dict[str, Any]) -> None:
    body = RULES.format(operators="true") if case["policy"] == "shell" else CUSTOM
    tool, arguments = case["call"]
    d = decide(store_for(tmp_path, body), tool, arguments)
    assert d.allowed and d.plan is not None and d.plan.command is not None, d.message
    wire = d.plan.command.to_wire()
    assert json.dumps(wire) == json.dumps(case["wire"])
    # and back: the decoded plan is the policy's plan
    assert Plan.from_wire(json.loads(json.dumps(wire))) == d.plan.command


def _plan() -> ExecutionPlan:
    command = Plan.from_wire(WIRE[2]["wire"])
    return ExecutionPlan(kind=ToolKind.command, limits=Limits(timeout_s=5), command=command,
                         imports_allow=("math",), image="img", network="net", path="a/b",
                         max_file_bytes=7, display=DisplayCaps(10, 2))


def test_an_execution_plan_round_trips() -> None:
    plan = _plan()
    wire = json.loads(json.dumps(plan.to_wire()))
    assert ExecutionPlan.from_wire(wire) == plan
    assert wire["command"] == WIRE[2]["wire"] and wire["display"] == {"item_bytes": 10,
                                                                      "count": 2}


def _with(path: list[Any], value: Any) -> dict[str, Any]:
    wire = json.loads(json.dumps(_plan().to_wire()))
    at = wire
    for key in path[:-1]:
        at = at[key]
    if value is KeyError:
        del at[path[-1]]
    else:
        at[path[-1]] = value
    return wire


@pytest.mark.parametrize(("path", "value", "says"), [
    (["kind"], "shell", "kind must be one of"),
    (["kind"], KeyError, "missing"),
    (["extra"], 1, "unknown keys"),
    (["limits", "timeout_s"], 10**9, "timeout_s must be between"),
    (["limits", "network"], "yes", "network must be true or false"),
    (["imports_allow"], "math", "imports_allow must be a list"),
    (["imports_allow"], [1], "imports_allow[0] must be a string"),
    (["imports_deny"], ["x"] * 5000, "imports_deny must have 0 to 4096 entries"),
    (["image"], "x" * (MAX_TEXT + 1), "image must be a string of at most"),
    (["path"], 3, "path must be a string"),
    (["max_file_bytes"], True, "max_file_bytes must be a whole number"),
    (["max_file_bytes"], -1, "max_file_bytes must be a whole number"),
    (["display", "count"], 1.5, "display.count must be a whole number"),
    (["display"], {"item_bytes": 1}, "missing"),
    (["command", "pipelines"], [], "command.pipelines must have 1 to"),
    (["command", "pipelines", 0, "commands"], [], "commands must have 1 to"),
    (["command", "pipelines", 0, "run_if"], "sometimes", "run_if must be one of"),
    (["command", "pipelines", 0, "commands", 0, "argv"], [], "argv must have 1 to"),
    (["command", "pipelines", 0, "commands", 0, "argv"], ["ls", None], "argv[1] must be a str"),
    (["command", "pipelines", 0, "commands", 0, "env"], {"A": 1}, "env[A] must be a string"),
    (["command", "pipelines", 0, "commands", 0, "env"], [], "env must be an object"),
    (["command", "pipelines", 0, "commands", 0, "exec_only"], "git", "exec_only must be a list"),
    (["command", "pipelines", 0, "commands", 0, "shell"], "sh -c x", "unknown keys"),
    (["command", "pipelines", 0, "commands", 0, "redirects"],
     [{"fd": 1, "mode": "write", "path": "x", "dup": None}] * (MAX_REDIRECTS + 1),
     "redirects must have 0 to"),
    (["command", "pipelines", 0, "commands", 0, "redirects", 0, "fd"], 10, "fd must be a whole"),
    (["command", "pipelines", 0, "commands", 0, "redirects", 0, "fd"], "1", "fd must be a whole"),
    (["command", "pipelines", 0, "commands", 0, "redirects", 0, "mode"], "exec", "mode must be"),
    (["command", "pipelines", 0, "commands", 0, "redirects", 1, "dup"], -1, "dup must be"),
])
def test_from_wire_refuses(path: list[Any], value: Any, says: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        ExecutionPlan.from_wire(_with(path, value))
    assert says in str(info.value)


@pytest.mark.parametrize("data", [None, [], "plan", {"pipelines": None}])
def test_from_wire_refuses_what_is_no_object(data: Any) -> None:
    with pytest.raises(ValueError):
        Plan.from_wire(data)
    with pytest.raises(ValueError):
        ExecutionPlan.from_wire(data)


def test_the_dataclasses_check_what_they_are_built_from() -> None:
    with pytest.raises(ValueError):
        PlannedCommand(argv=())
    with pytest.raises(ValueError):
        Redirect(fd=12, mode="write", path="x")
    with pytest.raises(ValueError):
        Plan(pipelines=())
    assert Plan.single(["ls", "-l"]).argv == ["ls", "-l"]


EXPLAIN = json.loads((Path(__file__).parent / "data" / "explain_json.json").read_text("utf-8"))
#: what a denial no longer repeats: it has no plan (docs/policy.md, "The plan")
NO_PLAN = {"limits": None, "kind": None, "plan": None, "argv": None, "imports_allow": [],
           "imports_deny": [], "image": None, "network": None, "max_file_bytes": 1024 * 1024,
           "path": None}


@pytest.mark.parametrize("case", EXPLAIN, ids=lambda c: json.dumps(c["call"])[:60])
def test_the_explain_json_keeps_its_form(tmp_path: Path, case: dict[str, Any]) -> None:
    """``policy explain``'s JSON (``Decision.model_dump``) as the loose fields wrote it
    (``data/explain_json.json``, written before the plan): the same keys in the same order,
    the same values for an allowed call; a denial's plan keys hold their empty values."""
    from tests.policy import test_decisions

    tool, arguments = case["call"]
    d = decide(store_for(tmp_path, getattr(test_decisions, case["policy"])), tool, arguments)
    dump = d.model_dump(mode="json")
    dump.pop("source")
    assert list(dump) == list(case["json"])
    expected = case["json"] if case["allowed"] else {**case["json"], **NO_PLAN}
    assert json.dumps(dump) == json.dumps(expected)
