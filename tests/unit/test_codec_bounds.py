"""Every wire member of the protocol keeps its bound (:mod:`sandboxd.protocol.decode`).

A report is written inside a sandbox by an attacker who has read the code, so each member's
bound is pinned here in words (:data:`BOUNDS`: a loosened bound, or a new member without
one, fails), and each member is fed the values just outside its bound, derived from its
codec: every one must be refused with a ``ValueError`` naming the member, and the values at
the edge of the bound must still be accepted."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

from sandboxd.protocol import decode as d
from sandboxd.protocol.call import (
    MAX_VALUE_NODES,
    JsonValue,
    ProbeCheck,
    WorkerReport,
    WorkerRequest,
)
from sandboxd.protocol.display import DisplayCaps
from sandboxd.protocol.plan import (
    ExecutionPlan,
    Pipeline,
    Plan,
    PlannedCommand,
    Redirect,
    ToolKind,
)

#: each record with a valid wire form to put an out-of-bound member into
RECORDS: dict[type[d.Record], dict[str, Any]] = {
    WorkerRequest: WorkerRequest(kind="python").to_wire(),
    WorkerReport: WorkerReport().to_wire(),
    ExecutionPlan: ExecutionPlan(kind=ToolKind.python).to_wire(),
    Plan: Plan.single(["ls"]).to_wire(),
    Pipeline: Plan.single(["ls"]).pipelines[0].to_wire(),
    PlannedCommand: PlannedCommand(argv=("ls",)).to_wire(),
    Redirect: Redirect(fd=1, mode="write", path="x").to_wire(),
    DisplayCaps: DisplayCaps().to_wire(),
}


def describe(codec: d.Codec[Any]) -> str:
    """A codec's bound in words."""
    match codec:
        case d.Int(low, high):
            return f"int {low}..{high}"
        case d.Seconds(low, high):
            return f"seconds {low:g}..{high:g}"
        case d.Text(most):
            return f"text <= {most}"
        case d.Hex(most):
            return f"hex <= {most}"
        case d.Choice(allowed):
            return "one of " + "|".join(allowed)
        case d.Flag():
            return "bool"
        case d.OrNone(inner):
            return f"{describe(inner)} or null"
        case d.ListOf(item, most, least):
            return f"list {least}..{most} of ({describe(item)})"
        case d.MapOf(key, value, most):
            return f"map <= {most} of ({describe(key)}: {describe(value)})"
        case d.Nested(kind):
            return str(kind.__name__)
        case JsonValue():
            return f"json <= {MAX_VALUE_NODES} parts"
        case ProbeCheck():
            return "[bool, text <= 4096]"
    raise AssertionError(f"no words for {codec!r}: describe its bound here")


#: every member's bound, in words (see :func:`describe`)
BOUNDS = {
    "WorkerRequest": {
        "kind": "one of python|bash|javascript|typescript|plan|kernel_stop|suspend",
        "id": "text <= 128",
        "limits": "Limits",
        "display": "DisplayCaps",
        "code": "text <= 16777216",
        "plan": "Plan or null",
        "imports_allow": "list 0..4096 of (text <= 1048576)",
        "imports_deny": "list 0..4096 of (text <= 1048576)",
        "kernel": "bool",
        "snapshot": "bool",
        "state_bytes": "int 0..268435456",
        "woken": "bool",
        "workspace": "text <= 1048576",
        "uid": "int 0..4294967295 or null",
        "cpu_seconds": "int 0..2147483648",
        "cpu_call": "int 0..2147483648 or null",
        "max_file_bytes": "int 0..1125899906842624",
        "probe": "one of basic|memory or null",
        "outside_path": "text <= 1048576",
        "expect_unprivileged": "bool",
        "expect_namespaces": "bool",
        "no_namespaces_reason": "text <= 4096 or null",
        "env": "map <= 256 of (text <= 1048576: text <= 1048576)",
        "cwd": "text <= 1048576",
        "interrupt_grace_s": "seconds 0..3600",
        "resume_key": "hex <= 128",
        "programs": "list 0..4096 of (text <= 1048576)",
        "stdin": "bool",
    },
    "WorkerReport": {
        "outcome": "one of ok|error|memory_limit|output_limit|cpu_limit|setup_error or null",
        "exit_code": "int -255..255 or null",
        "signal": "int 1..127 or null",
        "value": "json <= 1000000 parts",
        "has_value": "bool",
        "value_repr": "text <= 65536 or null",
        "message": "text <= 4096 or null",
        "error": "text <= 4096 or null",
        "truncated_stdout": "bool",
        "worker_us": "int 0..9223372036854775807",
        "cpu_ms": "int 0..9223372036854775807",
        "peak_memory_bytes": "int 0..9223372036854775807",
        "wall_ms": "int 0..9223372036854775807",
        "oom": "bool",
        "pids_limit": "bool",
        "output_limit": "bool",
        "group_gone": "bool or null",
        "kernel_calls": "int 0..9223372036854775807 or null",
        "kernel_fresh": "bool or null",
        "kernel_lost": "bool",
        "kernel_stopped": "bool",
        "kernel_interrupted": "bool",
        "not_idle": "text <= 4096 or null",
        "probe": "map <= 64 of (text <= 64: [bool, text <= 4096]) or null",
        "restore_failed": "bool",
        "not_carried": "map <= 4096 of (text <= 256: text <= 4096) or null",
    },
    "ExecutionPlan": {
        "kind": "one of python|bash|javascript|typescript|command|read_file|write_file|list_files",
        "limits": "Limits",
        "command": "Plan or null",
        "imports_allow": "list 0..4096 of (text <= 1048576)",
        "imports_deny": "list 0..4096 of (text <= 1048576)",
        "image": "text <= 1048576 or null",
        "network": "text <= 1048576 or null",
        "path": "text <= 1048576 or null",
        "max_file_bytes": "int 0..1125899906842624",
        "display": "DisplayCaps",
        "programs": "list 0..4096 of (text <= 1048576)",
    },
    "Plan": {
        "pipelines": "list 1..4096 of (Pipeline)",
    },
    "Pipeline": {
        "run_if": "one of always|ok|failed",
        "commands": "list 1..4096 of (PlannedCommand)",
    },
    "PlannedCommand": {
        "argv": "list 1..65536 of (text <= 1048576)",
        "env": "map <= 256 of (text <= 1048576: text <= 1048576)",
        "exec_only": "list 0..4096 of (text <= 1048576) or null",
        "redirects": "list 0..64 of (Redirect)",
    },
    "Redirect": {
        "fd": "int 0..9",
        "mode": "one of read|write|append|readwrite|dup|close",
        "path": "text <= 1048576 or null",
        "dup": "int 0..9 or null",
    },
    "DisplayCaps": {
        "item_bytes": "int 1..1099511627776",
        "count": "int 0..1000000",
    },
}


def outside(codec: d.Codec[Any]) -> Iterator[Any]:
    """Values just outside ``codec``'s bound (and of the wrong type)."""
    match codec:
        case d.Int(low, high):
            yield from (low - 1, high + 1, True, float(low), str(low), None)
        case d.Seconds(low, high):
            yield from (low - 1, high + 1, math.nan, math.inf, True, str(low), None)
        case d.Text(most):
            yield from ("x" * (most + 1), 1, None, ["x"])
        case d.Hex(most):
            yield from ("0" * (most + 1), "DEADBEEF", " 0", "0x1", 1, None)
        case d.Choice(allowed):
            yield from (allowed[0] + "x", allowed[0].upper(), 1, None)
        case d.Flag():
            yield from (1, 0, "true", None, [])
        case d.OrNone(inner):
            yield from (v for v in outside(inner) if v is not None)
        case d.ListOf(item, most, least):
            yield from ("x", {}, None, [None] * (most + 1))
            if least:
                yield [None] * (least - 1)
            yield from ([bad] for bad in outside(item))
        case d.MapOf(key, value, most):
            yield from ([], "x", None, {str(i): "" for i in range(most + 1)})
            yield from ({bad: ""} for bad in outside(key) if isinstance(bad, str))
            yield from ({"a": bad} for bad in outside(value))
        case d.Nested():
            yield from ("x", [], None, {"bogus": 1})
        case JsonValue():
            yield from (math.inf, {1: 2}, (1, 2), {"a": [b"x"]},
                        [[0]] * (MAX_VALUE_NODES + 1))
        case ProbeCheck():
            yield from ([1, "x"], [True], [True, "x", "y"], [True, "x" * 4097], "ok", None)
        case _:
            raise AssertionError(f"no out-of-bound values for {codec!r}")


def edges(codec: d.Codec[Any]) -> Iterator[Any]:
    """Values at the edge of ``codec``'s bound, which it must accept."""
    match codec:
        case d.Int(low, high) | d.Seconds(low, high):
            yield from (low, high)
        case d.Text(most):
            yield from ("", "x" * most)
        case d.Hex(most):
            yield from ("", "0" * most)
        case d.Choice(allowed):
            yield from allowed
        case d.Flag():
            yield from (True, False)
        case d.OrNone(inner):
            yield None
            yield from edges(inner)


def _wire_members(cls: type[d.Record]) -> Iterator[tuple[str, d.Codec[Any]]]:
    """Each member on the wire and its codec, a part's among its record's."""
    for f, spec in cls.wire_fields():
        if isinstance(spec.codec, d.Part):
            yield from _wire_members(spec.codec.kind)
        else:
            yield f.name, spec.codec


def _read(record: d.Record, name: str) -> Any:
    """A member's decoded value, read through the record's parts."""
    for f, spec in type(record).wire_fields():
        if isinstance(spec.codec, d.Part) and name in spec.codec.kind.wire_names():
            return _read(getattr(record, f.name), name)
    return getattr(record, name)


def _members() -> Iterator[tuple[type[d.Record], str, d.Codec[Any]]]:
    for cls in RECORDS:
        for name, codec in _wire_members(cls):
            yield cls, name, codec


CASES = [(cls, name, bad) for cls, name, codec in _members() for bad in outside(codec)]


def _name(cls: type[d.Record], name: str) -> str:
    return cls.WIRE_MEMBER.format(what=cls.WIRE_NAME, name=name)


@pytest.mark.parametrize(("cls", "name", "bad"), CASES,
                         ids=[f"{c.__name__}.{n}-{str(b)[:20]}" for c, n, b in CASES])
def test_a_member_outside_its_bound_is_refused(cls: type[d.Record], name: str,
                                                bad: Any) -> None:
    with pytest.raises(ValueError) as caught:
        cls.from_wire({**RECORDS[cls], name: bad})
    assert _name(cls, name) in str(caught.value)


EDGES = [(cls, name, good) for cls, name, codec in _members() for good in edges(codec)
         if not (cls is WorkerRequest and name == "kind" and good == "plan")]


@pytest.mark.parametrize(("cls", "name", "good"), EDGES,
                         ids=[f"{c.__name__}.{n}-{str(g)[:20]}" for c, n, g in EDGES])
def test_a_member_at_the_edge_of_its_bound_is_accepted(cls: type[d.Record], name: str,
                                                       good: Any) -> None:
    record = cls.from_wire({**RECORDS[cls], name: good})
    assert _read(record, name) == good


def test_every_bound_is_pinned() -> None:
    """A loosened bound, or a member added without one, changes this table."""
    assert {cls.__name__: {name: describe(codec) for name, codec in _wire_members(cls)}
            for cls in RECORDS} == BOUNDS


NO_OBJECTS: tuple[Any, ...] = (None, [], "x", 1)


def test_a_record_refuses_what_is_no_object_and_unknown_members() -> None:
    for cls, wire in RECORDS.items():
        for bad in NO_OBJECTS:
            with pytest.raises(ValueError, match="must be an object"):
                cls.from_wire(bad)
        with pytest.raises(ValueError, match=r"unknown keys \['bogus'\]"):
            cls.from_wire({**wire, "bogus": 1})
