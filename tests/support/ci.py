"""CI rules for tests: in CI (CI=true) a missing requirement fails the test, never skips it."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def require(condition: bool, why: str) -> None:
    """Skip outside CI when ``condition`` is false; in CI (CI=true) fail loudly instead."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {why}", pytrace=False)
    pytest.skip(why)  # outside CI only: in CI the line above fails instead
