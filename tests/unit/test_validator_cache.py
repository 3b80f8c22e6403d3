"""Tool argument validators are built once per schema object (they were built per
call: daemon CPU on every call), and
a new schema object (a policy reload builds new tool specs) is never checked with another's."""

from __future__ import annotations

import gc

import pytest

from sandboxd import tools as registry
from sandboxd.tools import ArgumentsInvalid, validate_arguments


def schema(required: str) -> dict[str, object]:
    return {"type": "object", "properties": {required: {"type": "string"}},
            "required": [required], "additionalProperties": False}


def test_a_schema_object_keeps_its_validator() -> None:
    s = schema("code")
    validate_arguments("python", s, {"code": "1"})
    first = registry._VALIDATORS[id(s)][1]
    validate_arguments("python", s, {"code": "2"})
    assert registry._VALIDATORS[id(s)][1] is first


def test_a_new_schema_object_is_checked_with_its_own_rules(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Schemas made and dropped in turn (as reloads do), ids reused by the allocator or not:
    each call is checked against the schema it names."""
    monkeypatch.setattr(registry, "_VALIDATORS_MAX", 8)
    for i in range(30):  # past the cache's bound too
        name = f"p{i}"
        validate_arguments("t", schema(name), {name: "x"})
        with pytest.raises(ArgumentsInvalid):
            validate_arguments("t", schema(name), {"other": "x"})
        if i % 10 == 9:  # a full collection is slow in a big test process: now and then
            gc.collect()
    assert len(registry._VALIDATORS) <= registry._VALIDATORS_MAX
