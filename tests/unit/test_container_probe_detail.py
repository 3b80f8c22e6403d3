"""The container self-test's memory check says everything about a call that did not end at
its memory limit (the VM once saw a bare "-> exited", which said nothing about why)."""

from __future__ import annotations

from sandboxd.backends.container.probe import _how_it_ended
from sandboxd.models import Reason, Resources, Result


def test_the_expected_limit_is_one_word() -> None:
    result = Result.build(("c1", "python", None), "container", Reason.memory_limit, signal=9)
    assert _how_it_ended(result) == "memory_limit"


def test_anything_else_says_how_and_why() -> None:
    result = Result.build(
        ("c2", "python", None), "container", Reason.exited, exit_code=1,
        stderr="Traceback (most recent call last):\nMemoryError\n",
        resources=Resources(peak_memory_bytes=47 << 20),
    )
    said = _how_it_ended(result)
    assert said.startswith("exited: status error, exit code 1, signal None, peak 47 MiB")
    assert said.endswith("MemoryError"), said


def test_a_lost_runner_keeps_its_message() -> None:
    result = Result.build(("c3", "python", None), "container", Reason.exited,
                          message="the runner went away")
    assert "the runner went away" in _how_it_ended(result)
