"""One definition of every limit (so that no boundary reads one differently):
``sandboxd.protocol.limits.LIMITS`` is the table the policy file keys, the request fields, the
engine, the wire to a sandbox and the rlimits derive from. These tests fail when a boundary spells a
limit its own way."""

from __future__ import annotations

import ast
import math
import resource
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import sandboxd
from sandboxd.models import LimitsRequest
from sandboxd.policy.models import LIMIT_OF_KEY, LimitsSpec
from sandboxd.protocol.limits import LIMITS, RLIMIT_NAMES, Limits

PACKAGE = Path(sandboxd.__file__).parent

#: a value of each unit as an admin writes it in a policy file, and what it means
UNIT_SAMPLES: dict[str, tuple[Any, float]] = {
    "seconds": ("2m", 120.0), "bytes": ("64Mi", 64 * 1024 * 1024), "cpus": (1.5, 1.5),
    "count": (32, 32)}


def test_policy_keys_are_the_limits_table() -> None:
    keys = {k for info in LIMITS.values() for k in (info.policy, info.policy_max)}
    assert set(LimitsSpec.model_fields) == keys == set(LIMIT_OF_KEY)


def test_request_fields_are_the_limits_table() -> None:
    assert set(LimitsRequest.model_fields) == set(LIMITS)


@pytest.mark.parametrize("name", list(LIMITS))
def test_policy_key_is_written_in_its_unit(name: str) -> None:
    info = LIMITS[name]
    written, meant = UNIT_SAMPLES[info.unit]
    spec = LimitsSpec.model_validate({info.policy: written, info.policy_max: written})
    assert getattr(spec, info.policy) == meant == getattr(spec, info.policy_max)


@pytest.mark.parametrize("name", list(LIMITS))
def test_bounds_hold_in_policy_request_and_wire(name: str) -> None:
    info = LIMITS[name]
    above: float = info.maximum * 2
    if info.unit in ("bytes", "count"):
        above = int(above)
    with pytest.raises(ValidationError, match=f"{info.policy} must be between"):
        LimitsSpec.model_validate({info.policy: above})
    with pytest.raises(ValidationError, match=f"{name} must be between"):
        LimitsRequest.model_validate({name: above})
    wire = Limits().to_wire()
    with pytest.raises(ValueError, match=f"{name} must be between"):
        Limits.from_wire({**wire, name: above})
    if info.minimum > 1:  # a floor above "positive": below it is refused everywhere
        with pytest.raises(ValidationError):
            LimitsRequest.model_validate({name: info.minimum - 1})


def test_wire_round_trip_and_what_it_refuses() -> None:
    limits = Limits(timeout_s=2.5, memory_bytes=1 << 24, pids=9, network=True)
    assert Limits.from_wire(limits.to_wire()) == limits
    wire = Limits().to_wire()
    bad: list[Any] = [None, [], {**wire, "extra": 1}, {k: v for k, v in wire.items()
                                                       if k != "pids"},
                      {**wire, "pids": True}, {**wire, "pids": "64"},
                      {**wire, "timeout_s": math.nan}, {**wire, "memory_bytes": 1.5},
                      {**wire, "network": 1}]
    for data in bad:
        with pytest.raises(ValueError):
            Limits.from_wire(data)


def test_request_lowers_never_raises() -> None:
    base = Limits(timeout_s=10, pids=8)
    lowered = base.lowered_by({"timeout_s": 5, "pids": 100})
    assert (lowered.timeout_s, lowered.pids) == (5, 8)
    assert base.lowered_requests({"timeout_s": 5, "pids": 100}) == {"pids": (100, 8)}


def test_a_session_kernel_keeps_its_own_limits() -> None:
    kernel = Limits(memory_bytes=1 << 26, cpus=0.5, pids=7, timeout_s=9)
    call = Limits(memory_bytes=1 << 28, cpus=2, pids=70, timeout_s=3, output_bytes=10)
    kept = call.kept_by_kernel(kernel)
    for name, info in LIMITS.items():
        assert getattr(kept, name) == getattr(kernel if info.kernel else call, name), name


def test_rlimits_name_real_resources() -> None:
    assert set(Limits().rlimits()) == RLIMIT_NAMES
    for name in RLIMIT_NAMES:
        assert isinstance(getattr(resource, name), int)


def test_no_module_spells_a_policy_limit_key_of_its_own() -> None:
    """The policy keys (``max_memory``, ...) are written once: as LimitsSpec's fields. No
    string elsewhere in the package names one (a table of its own would)."""
    keys = {info.policy_max for info in LIMITS.values()}  # ("memory" is a plain word too)
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in keys:
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}")
    assert offenders == []


def test_docs_list_every_limit() -> None:
    """docs/policy.md's limits table has a row per limit, with its policy key and field."""
    text = (PACKAGE.parent / "docs" / "policy.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    for name, info in LIMITS.items():
        assert any(line.startswith(f"| `{info.policy}` | `{name}` |") for line in rows), name


def test_the_container_ceiling_holds_every_open_files_value() -> None:
    """The runner lowers RLIMIT_NOFILE per call; it cannot raise it above the container's."""
    from sandboxd.backends.container.engine import NOFILE

    assert LIMITS["open_files"].maximum <= NOFILE


def test_the_request_schema_states_every_bound() -> None:
    """A client (or schemathesis) reading the OpenAPI schema learns each limit's bounds: a
    schema-valid request is never refused for its limits."""
    props = LimitsRequest.model_json_schema()["properties"]
    for name, info in LIMITS.items():
        assert (props[name]["minimum"], props[name]["maximum"]) == (info.minimum, info.maximum)
