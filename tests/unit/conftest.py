"""Fixtures shared by tests/unit's modules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.scripted_engine import ScriptedEngine, scripted_engine


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ScriptedEngine]:
    """A Docker Engine API on a unix socket that answers as the test tells it
    (:mod:`tests.support.scripted_engine`)."""
    with scripted_engine(tmp_path / "engine.sock") as srv:
        yield srv
