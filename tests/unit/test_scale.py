"""tests/support/scale.py: the VM job's scaled counts and timing bounds (tests/vm/README.md)."""

from __future__ import annotations

import pytest

from tests.support.scale import rounds, scaled, time_bound


def test_full_scale_keeps_counts_and_strict_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDBOXD_TEST_SCALE", raising=False)
    assert scaled(200) == 200
    assert rounds(200, emulated=20) == 200
    assert time_bound(10.0, emulated_s=45.0) == 10.0


def test_a_scaled_run_has_fewer_rounds_and_a_hang_s_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOXD_TEST_SCALE", "0.2")
    assert scaled(200) == 40
    assert scaled(50) == 20  # the floor
    assert scaled(10) == 10  # never more than asked
    assert rounds(200, emulated=20) == 20
    assert rounds(10, emulated=20) == 10  # never more than make test's
    assert time_bound(10.0, emulated_s=45.0) == 45.0
    assert time_bound(10.0, emulated_s=5.0) == 10.0  # never stricter than make test's


@pytest.mark.parametrize("value", ["", "fast", "nan-ish"])
def test_a_bad_scale_is_full_scale(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("SANDBOXD_TEST_SCALE", value)
    assert scaled(200) == 200
    assert rounds(200, emulated=20) == 200
    assert time_bound(10.0, emulated_s=45.0) == 10.0
