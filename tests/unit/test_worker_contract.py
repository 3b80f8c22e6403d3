"""The call contract between the daemon and both sandboxes (:mod:`sandboxd.protocol.call`):
:class:`WorkerRequest` and :class:`WorkerReport` round-trip through JSON, ``from_wire``
refuses every member beyond its bound with a ``ValueError`` naming it (a report is written by
an attacker), arbitrary JSON never gets another exception out of it, and the restricted
worker, its daemon side and the container runner all use these two definitions - no request
or report of their own (an AST check)."""

from __future__ import annotations

import ast
import inspect
import json
import math
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandboxd.protocol import call
from sandboxd.protocol.call import RestrictedPart, RunnerPart, WorkerReport, WorkerRequest
from sandboxd.protocol.display import MAX_VALUE_REPR, DisplayCaps
from sandboxd.protocol.limits import Limits
from sandboxd.protocol.plan import MAX_TEXT, Plan

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "images" / "runner" / "sandboxd_runner"
RESTRICTED = ROOT / "sandboxd" / "backends" / "restricted"
CONTAINER = ROOT / "sandboxd" / "backends" / "container"

REQUESTS = [
    WorkerRequest(kind="python", id="c0123", code="print(1)", imports_allow=("math",),
                  imports_deny=("os",), kernel=True,
                  limits=Limits(timeout_s=2.5, open_files=32),
                  display=DisplayCaps(item_bytes=4096, count=3),
                  restricted=RestrictedPart(workspace="/var/lib/sandboxd/ws/x", uid=10123,
                                            cpu_seconds=61, max_file_bytes=1 << 20)),
    WorkerRequest(kind="python", restricted=RestrictedPart(
        probe="basic", outside_path="/tmp/x", expect_namespaces=True,
        expect_unprivileged=True, no_namespaces_reason="no user namespaces", cpu_call=3)),
    WorkerRequest(kind="plan", id="inv-1", plan=Plan.single(["ls", "-l"]),
                  runner=RunnerPart(env={"PATH": "/usr/bin", "HOME": "/workspace"},
                                    cwd="/workspace", interrupt_grace_s=2.0, stdin=True)),
    WorkerRequest(kind="bash", code="ls", runner=RunnerPart(programs=("ls", "cat"))),
    WorkerRequest.stop_kernel(),
    WorkerRequest.suspend(bytes(range(32))),
]
REPORTS = [
    WorkerReport(outcome="ok", exit_code=0, value={"a": [1, 2.5, None, True]}, has_value=True,
                 value_repr="{'a': [1, 2.5, None, True]}", truncated_stdout=True,
                 worker_us=812),
    WorkerReport(outcome="ok", probe={"seccomp": (True, "mode 2"), "landlock": (False, "off")}),
    WorkerReport(exit_code=None, signal=9, cpu_ms=10, peak_memory_bytes=1 << 20, wall_ms=5,
                 oom=True, pids_limit=True, output_limit=True, group_gone=True,
                 kernel_calls=0, kernel_fresh=False, kernel_lost=True, kernel_stopped=True,
                 not_idle="a thread", error="display(): too big", message="ValueError: x"),
    WorkerReport(error="refused: limits must have ..."),
    WorkerReport(kernel_interrupted=True, kernel_calls=4, kernel_fresh=True, has_value=True),
]


def _json(data: Any) -> Any:
    return json.loads(json.dumps(data))


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: r.kind)
def test_a_request_round_trips(request_: WorkerRequest) -> None:
    assert WorkerRequest.from_wire(_json(request_.to_wire())) == request_


@pytest.mark.parametrize("report", REPORTS)
def test_a_report_round_trips(report: WorkerReport) -> None:
    assert WorkerReport.from_wire(_json(report.to_wire())) == report


def test_a_report_says_only_what_differs_from_its_defaults() -> None:
    assert WorkerReport().to_wire() == {}
    assert WorkerReport(error="x").to_wire() == {"error": "x"}
    # a value reported as null is a value
    assert WorkerReport(has_value=True).to_wire() == {"value": None, "has_value": True}
    assert WorkerReport.from_wire({"value": None}).has_value


def _request(**members: Any) -> dict[str, Any]:
    return {**WorkerRequest(kind="python").to_wire(), **members}


BAD_REQUESTS = [
    ([], "request must be an object"),
    ({"code": "1"}, "missing ['kind']"),
    (_request(kind="shell"), "kind must be one of"),
    (_request(bogus=1), "unknown keys ['bogus']"),
    (_request(id="x" * (call.MAX_ID + 1)), "id must be a string of at most"),
    (_request(id=7), "id must be a string"),
    (_request(code="x" * (call.MAX_CODE + 1)), "code must be a string of at most"),
    (_request(code=None), "code must be a string"),
    (_request(limits={"timeout_s": 1}), "limits must have exactly the keys"),
    (_request(limits={**Limits().to_wire(), "open_files": 9}), "open_files must be between"),
    (_request(limits={**Limits().to_wire(), "memory_bytes": True}), "memory_bytes must be a"),
    (_request(display={"item_bytes": 0, "count": 1}), "display.item_bytes must be"),
    (_request(display={"item_bytes": 1}), "display: missing ['count']"),
    (_request(plan={"pipelines": []}), "plan.pipelines must have 1 to"),
    (_request(kind="plan", plan=None), "a plan request needs its plan"),
    (_request(imports_allow="math"), "imports_allow must be a list"),
    (_request(imports_deny=["x"] * 5000), "imports_deny must have 0 to 4096 entries"),
    (_request(imports_allow=[1]), "imports_allow[0] must be a string"),
    (_request(kind="bash", programs="ls"), "programs must be a list"),
    (_request(kind="bash", programs=[None]), "programs[0] must be a string"),
    (_request(kernel=1), "kernel must be true or false"),
    (_request(stdin="yes"), "stdin must be true or false"),
    (_request(uid=-1), "uid must be a whole number from 0"),
    (_request(uid=2**32), "uid must be a whole number from 0"),
    (_request(uid=True), "uid must be a whole number"),
    (_request(cpu_seconds=-1), "cpu_seconds must be a whole number"),
    (_request(cpu_seconds=1.5), "cpu_seconds must be a whole number"),
    (_request(cpu_call=2**40), "cpu_call must be a whole number"),
    (_request(max_file_bytes=2**51), "max_file_bytes must be a whole number"),
    (_request(probe="escape"), "probe must be one of ['basic', 'memory']"),
    (_request(expect_namespaces="yes"), "expect_namespaces must be true or false"),
    (_request(expect_unprivileged=None), "expect_unprivileged must be true or false"),
    (_request(workspace="x" * (MAX_TEXT + 1)), "workspace must be a string of at most"),
    (_request(outside_path=3), "outside_path must be a string"),
    (_request(no_namespaces_reason="x" * 5000), "no_namespaces_reason must be a string"),
    (_request(env={"A": 1}), "env[A] must be a string"),
    (_request(env={str(i): "" for i in range(300)}), "env must be an object of at most"),
    (_request(env=[]), "env must be an object"),
    (_request(cwd=None), "cwd must be a string"),
    (_request(interrupt_grace_s=math.nan), "interrupt_grace_s must be a number of seconds"),
    (_request(interrupt_grace_s=-1), "interrupt_grace_s must be a number of seconds"),
    (_request(interrupt_grace_s=1e9), "interrupt_grace_s must be a number of seconds"),
    (_request(interrupt_grace_s="2"), "interrupt_grace_s must be a number of seconds"),
    (_request(resume_key="ab" * (call.MAX_KEY_HEX // 2 + 1)), "resume_key must be lower-case hex"),
    (_request(resume_key="DEADBEEF"), "resume_key must be lower-case hex"),
    (_request(resume_key=" 0"), "resume_key must be lower-case hex"),
    (_request(resume_key=12), "resume_key must be lower-case hex"),
    (_request(snapshot=1), "snapshot must be true or false"),
    (_request(state_bytes=call.FORK_STATE_BYTES + 1), "state_bytes must be a whole number"),
    (_request(state_bytes=-1), "state_bytes must be a whole number"),
    (_request(woken="yes"), "woken must be true or false"),
]


@pytest.mark.parametrize(("data", "says"), BAD_REQUESTS, ids=lambda v: str(v)[:50])
def test_a_request_beyond_its_bounds_is_refused(data: Any, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        WorkerRequest.from_wire(data)
    assert says in str(caught.value)


def test_every_request_member_is_bounded() -> None:
    """Each member has a refusal above (a new member needs its own)."""
    default = WorkerRequest(kind="python").to_wire()
    refused = {key for data, _ in BAD_REQUESTS if isinstance(data, dict)
               for key, value in data.items() if value != default.get(key, ...)}
    assert set(WorkerRequest.wire_names()) <= refused


BAD_REPORTS = [
    ("not an object", "report must be an object"),
    ({"exit": 0}, "unknown keys ['exit']"),
    ({"outcome": "escaped"}, "the report's outcome must be one of"),
    ({"exit_code": 256}, "the report's exit_code must be a whole number from -255 to 255"),
    ({"exit_code": True}, "the report's exit_code must be a whole number"),
    ({"exit_code": 1.0}, "the report's exit_code must be a whole number"),
    ({"signal": 0}, "the report's signal must be a whole number from 1 to 127"),
    ({"signal": 128}, "the report's signal must be a whole number from 1 to 127"),
    ({"value": {"a": math.inf}}, "the report's value has a number that is not finite"),
    ({"value": {1: 2}}, "the report's value has a key that is not a string"),
    ({"value": (1, 2)}, "the report's value has a tuple, not a JSON value"),
    ({"value": [[0]] * (call.MAX_VALUE_NODES + 1)}, "the report's value has more than"),
    ({"has_value": "yes"}, "the report's has_value must be true or false"),
    ({"value_repr": "x" * (MAX_VALUE_REPR + 1)}, "the report's value_repr must be a string"),
    ({"message": "x" * (call.MAX_REPORT_TEXT + 1)}, "the report's message must be a string"),
    ({"error": ["x"]}, "the report's error must be a string"),
    ({"not_idle": 5}, "the report's not_idle must be a string"),
    ({"truncated_stdout": 1}, "the report's truncated_stdout must be true or false"),
    ({"worker_us": -1}, "the report's worker_us must be a whole number from 0"),
    ({"cpu_ms": 2**63}, "the report's cpu_ms must be a whole number from 0"),
    ({"peak_memory_bytes": "1"}, "the report's peak_memory_bytes must be a whole number"),
    ({"wall_ms": False}, "the report's wall_ms must be a whole number"),
    ({"oom": None}, "the report's oom must be true or false"),
    ({"pids_limit": "false"}, "the report's pids_limit must be true or false"),
    ({"output_limit": 0}, "the report's output_limit must be true or false"),
    ({"group_gone": 1}, "the report's group_gone must be true or false"),
    ({"kernel_calls": -2}, "the report's kernel_calls must be a whole number from 0"),
    ({"kernel_fresh": "no"}, "the report's kernel_fresh must be true or false"),
    ({"kernel_lost": 0}, "the report's kernel_lost must be true or false"),
    ({"kernel_stopped": []}, "the report's kernel_stopped must be true or false"),
    ({"kernel_interrupted": {}}, "the report's kernel_interrupted must be true or false"),
    ({"probe": []}, "the report's probe must be an object of at most"),
    ({"probe": {str(i): [True, ""] for i in range(65)}}, "the report's probe must be an"),
    ({"probe": {"x" * 65: [True, ""]}}, "the report's probe key must be a string of at most"),
    ({"probe": {"seccomp": [1, "x"]}}, "the report's probe[seccomp] must be [true or false"),
    ({"probe": {"seccomp": [True]}}, "the report's probe[seccomp] must be [true or false"),
    ({"probe": {"seccomp": [True, "x" * 5000]}}, "the report's probe[seccomp] detail must"),
    ({"restore_failed": "yes"}, "the report's restore_failed must be true or false"),
    ({"not_carried": []}, "the report's not_carried must be an object of at most"),
    ({"not_carried": {"x" * 300: "why"}}, "the report's not_carried key must be a string"),
    ({"not_carried": {"gen": 1}}, "the report's not_carried[gen] must be a string"),
]


@pytest.mark.parametrize(("data", "says"), BAD_REPORTS, ids=lambda v: str(v)[:50])
def test_a_report_beyond_its_bounds_is_refused(data: Any, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        WorkerReport.from_wire(data)
    assert says in str(caught.value)


def test_every_report_member_is_bounded() -> None:
    refused = {key for data, _ in BAD_REPORTS if isinstance(data, dict) for key in data}
    assert {f.name for f in fields(WorkerReport)} == refused - {"exit"}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)
REPORT_MEMBERS = st.sampled_from([f.name for f in fields(WorkerReport)] + ["bogus"])
REQUEST_MEMBERS = st.sampled_from([*WorkerRequest.wire_names(), "bogus"])


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(REPORT_MEMBERS, JSON, max_size=6) | JSON)
def test_any_json_is_a_report_or_a_value_error(data: Any) -> None:
    try:
        report = WorkerReport.from_wire(data)
    except ValueError:
        return
    assert WorkerReport.from_wire(_json(report.to_wire())) == report


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(REQUEST_MEMBERS, JSON, max_size=6) | JSON)
def test_any_json_is_a_request_or_a_value_error(data: Any) -> None:
    try:
        request = WorkerRequest.from_wire(data)
    except ValueError:
        return
    assert WorkerRequest.from_wire(_json(request.to_wire())) == request


# ---------------------------------------------------------------- one definition, both sides

#: members only a request or a report has: a dict literal with one of them is a hand-made
#: request or report (``code`` and ``kernel`` name other things too: tool arguments, results)
CONTRACT_KEYS = (set(WorkerRequest.wire_names()) | {f.name for f in fields(WorkerReport)}
                 | {"rlimits", "output_bytes", "max_file", "allow", "deny"}) - {
    "id", "kind", "code", "env", "display", "value", "message", "error", "signal", "kernel",
    "probe"}
#: the dicts allowed, each a hop inside one side, not between the daemon and a sandbox
ALLOWED = {
    # the runner's hop to its own kernel process (marshal, read by a loop that runs no
    # Python-level decoder user code could have patched)
    ("images/runner/sandboxd_runner/kernel.py",
     frozenset({"code", "imports_allow", "imports_deny", "display"})),
    # the runner's hop to its node kernel (JSON: the module rule the kernel's require applies)
    ("images/runner/sandboxd_runner/js_kernel.py", frozenset({"allow", "deny"})),
    # a python worker's answer to its runner, merged into the report by answer_fields
    ("images/runner/sandboxd_runner/execution.py", frozenset({"value", "value_repr"})),
    # the language layer's result, made a WorkerReport by the worker (which refuses any
    # member the dataclass does not define)
    ("sandboxd/backends/restricted/lang/__init__.py",
     frozenset({"outcome", "exit_code", "value"})),
    # the zygote's exit report of a worker (process status and cgroup), not the worker's
    ("sandboxd/backends/restricted/kernel.py", frozenset({"cpu_ms", "peak_memory"})),
}


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for root in (RUNNER, RESTRICTED, CONTAINER):
        for path in sorted(root.rglob("*.py")):
            yield path, ast.parse(path.read_text("utf-8"))


def _imports_from_protocol(tree: ast.Module) -> set[str]:
    return {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module == "sandboxd.protocol.call" for alias in node.names}


def test_no_request_or_report_is_made_by_hand() -> None:
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Dict):
                continue
            keys = frozenset(k.value for k in node.keys
                             if isinstance(k, ast.Constant) and isinstance(k.value, str))
            where = path.relative_to(ROOT).as_posix()
            if keys & CONTRACT_KEYS and (where, keys) not in ALLOWED:
                found.append(f"{where}:{node.lineno} {sorted(keys)}")
    assert not found, found


def test_both_sandboxes_decode_the_same_request() -> None:
    """The restricted worker and the runner's loop decode what the daemon sends with
    WorkerRequest.from_wire; the daemon's side of each builds a WorkerRequest."""
    decoders = {path.relative_to(ROOT).as_posix() for path, tree in _modules()
                for node in ast.walk(tree)
                if isinstance(node, ast.Attribute) and node.attr == "from_wire"
                and isinstance(node.value, ast.Name) and node.value.id == "WorkerRequest"}
    assert decoders == {"images/runner/sandboxd_runner/main.py",
                        "sandboxd/backends/restricted/worker.py"}
    for path in (RUNNER / "main.py", RESTRICTED / "worker.py", RESTRICTED / "standby.py",
                 CONTAINER / "calls.py"):
        assert "WorkerRequest" in _imports_from_protocol(ast.parse(path.read_text("utf-8")))


def _parts_read(root: Path) -> set[str]:
    """The request parts (``.restricted``, ``.runner``) the code under ``root`` reads."""
    return {node.attr for path in root.rglob("*.py")
            for node in ast.walk(ast.parse(path.read_text("utf-8")))
            if isinstance(node, ast.Attribute) and node.attr in {"restricted", "runner"}
            and isinstance(node.value, ast.Name | ast.Attribute)
            and (node.value.id if isinstance(node.value, ast.Name) else node.value.attr)
            in {"msg", "req", "request", "kernel_request", "base"}}


def test_each_sandbox_reads_the_common_request_and_its_own_part_only() -> None:
    """The request is one common part and a part per sandbox: the restricted side never
    reads the runner's part, the runner and the container backend never the restricted
    worker's."""
    assert _parts_read(RESTRICTED) == {"restricted"}
    assert _parts_read(RUNNER) == {"runner"}
    assert _parts_read(CONTAINER) == {"runner"}


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: r.kind)
def test_the_parts_sit_among_the_common_members_on_the_wire(request_: WorkerRequest) -> None:
    """One flat object, as before the parts were typed apart: a runner built before the
    split (a kept session's, across an upgrade) reads what a new daemon sends."""
    wire = request_.to_wire()
    assert not {"restricted", "runner"} & set(wire)
    assert set(wire) <= set(WorkerRequest.wire_names())
    for name in RestrictedPart.wire_names():
        assert wire.get(name, ...) == getattr(request_.restricted, name)


def test_both_sandboxes_reports_are_decoded_by_one_definition() -> None:
    decoders = {path.relative_to(ROOT).as_posix() for path, tree in _modules()
                for node in ast.walk(tree)
                if isinstance(node, ast.Attribute) and node.attr == "from_wire"
                and isinstance(node.value, ast.Name) and node.value.id == "WorkerReport"}
    assert decoders == {"sandboxd/backends/restricted/frames.py",
                        "sandboxd/backends/container/runner.py"}


def test_both_sandboxes_send_reports_made_by_the_dataclass() -> None:
    """Every report frame (the runner's ``x``, the restricted worker's ``r``) is written
    from a WorkerReport: the runner's by channel.send_report, the worker's by _report."""
    senders = set()
    for path, tree in _modules():
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, ast.Call) or not any(
                        isinstance(a, ast.Constant) and a.value in (b"x", b"r")
                        for a in node.args):
                    continue
                senders.add(f"{path.relative_to(ROOT)}:{fn.name}")
                payload = node.args[-1]
                if path.name == "worker.py":  # emit(b"r", _report(WorkerReport(...)))
                    assert (isinstance(payload, ast.Call) and isinstance(payload.func, ast.Name)
                            and payload.func.id == "_report"), ast.unparse(node)
    assert senders == {"images/runner/sandboxd_runner/channel.py:send_report",
                       "sandboxd/backends/restricted/worker.py:run_worker"}, senders


def test_a_backend_reads_its_limits_from_the_plan_only() -> None:
    """``Backend.run(invocation, deadline)``: the call's limits are ``invocation.plan.limits``
    and nowhere else (no second copy a caller could pass out of step with the plan)."""
    from sandboxd.backends import registry
    from sandboxd.backends.base import Backend
    from sandboxd.backends.scripted import ScriptedBackend

    classes = [Backend, ScriptedBackend] + [
        registry.load(entry.factory.rpartition(".")[0]) for entry in registry.entries()]
    for cls in classes:
        assert list(inspect.signature(cls.run).parameters) == ["self", "invocation",
                                                               "deadline"], cls
