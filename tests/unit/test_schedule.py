"""make test's workers take the longest test files first (tests/support/schedule.py): the
files listed exist, the order puts them first and keeps the rest, and xdist is told not to
reorder the files by their number of tests (which would undo it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.schedule import LONGEST, longest_first

REPO = Path(__file__).resolve().parents[2]


@dataclass
class _Item:
    path: Path
    name: str


def test_every_listed_file_exists_once() -> None:
    assert LONGEST, "no file is listed: the order is the collection's"
    assert len(set(LONGEST)) == len(LONGEST)
    missing = [p for p in LONGEST if not (REPO / p).is_file()]
    assert missing == [], f"renamed or removed: update tests/support/schedule.py: {missing}"


def test_listed_files_first_in_their_order_the_rest_as_collected() -> None:
    first, second = LONGEST[0], LONGEST[1]
    items: list[Any] = [
        _Item(REPO / "tests/unit/test_a.py", "a1"), _Item(REPO / second, "s1"),
        _Item(REPO / "tests/api/test_b.py", "b1"), _Item(REPO / first, "f1"),
        _Item(REPO / second, "s2"), _Item(REPO / "tests/unit/test_a.py", "a2")]
    assert [i.name for i in longest_first(items, REPO)] == ["f1", "s1", "s2", "a1", "b1", "a2"]


def test_make_test_keeps_the_order() -> None:
    makefile = (REPO / "Makefile").read_text()
    (line,) = [x for x in makefile.splitlines() if "--dist loadfile" in x]
    assert re.search(r"--dist loadfile --no-loadscope-reorder\b", line), line
