"""make test's workers side by side (pytest-xdist): each has its own sandbox uid range, and a
rerun is still named once as ``FLAKY:`` at the end and in the flaky file (parallel
workers must hide no flaky test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemon import TEST_UID_BASE
from tests.support.workers import FIRST_UID, STRIDE, worker_uid_range

REPO = Path(__file__).resolve().parents[2]


def test_each_worker_has_its_own_range_below_the_test_daemons() -> None:
    firsts = [int(worker_uid_range({"PYTEST_XDIST_WORKER": f"gw{n}"})
                  ["SANDBOXD_SANDBOX_UID_FIRST"]) for n in range(4)]
    assert firsts == [FIRST_UID + STRIDE * n for n in range(4)]
    assert all(f + STRIDE <= TEST_UID_BASE for f in firsts)
    assert worker_uid_range({}) == {}  # one process: the default range, as before
    # a range named already (the VM job's lanes) is kept
    assert worker_uid_range({"PYTEST_XDIST_WORKER": "gw1",
                             "SANDBOXD_SANDBOX_UID_FIRST": "12345"}) == {}
    with pytest.raises(RuntimeError, match="fewer workers"):
        worker_uid_range({"PYTEST_XDIST_WORKER": "gw9"})


CONFTEST = """\
from tests.conftest import pytest_runtest_logreport, pytest_terminal_summary  # the real hooks
"""
HEADER = """\
import os
from pathlib import Path
"""
FAILS_ONCE = """\


def test_fails_once():
    mark = Path(os.environ["MARK"])
    if not mark.exists():
        mark.touch()
        raise AssertionError("first try")
"""
RECORDS_ITS_RANGE = """\


def test_records_its_range():
    out = Path(os.environ["OUT"]) / os.environ["PYTEST_XDIST_WORKER"]
    out.write_text(os.environ["SANDBOXD_SANDBOX_UID_FIRST"])
"""


def test_a_rerun_under_two_workers_is_named_once(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text(CONFTEST)
    (suite / "test_a.py").write_text(HEADER + FAILS_ONCE + RECORDS_ITS_RANGE)
    (suite / "test_b.py").write_text(HEADER + RECORDS_ITS_RANGE)
    out = tmp_path / "out"
    out.mkdir()
    flaky_file = tmp_path / "flaky.txt"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "SANDBOXD_SANDBOX_UID"))}
    env.update(PYTHONPATH=str(REPO), MARK=str(tmp_path / "mark"), OUT=str(out),
               SANDBOXD_FLAKY_FILE=str(flaky_file))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", "--reruns", "1",
         "-p", "no:cacheprovider", "-p", "no:randomly", "--rootdir", str(suite), str(suite)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    flaky = [line for line in run.stdout.splitlines() if line.startswith("FLAKY: ")]
    assert flaky == ["FLAKY: test_a.py::test_fails_once"], run.stdout
    assert flaky_file.read_text().splitlines() == flaky
    ranges = {p.name: int(p.read_text()) for p in out.iterdir()}
    assert ranges and all(first == FIRST_UID + STRIDE * int(worker[2:])
                          for worker, first in ranges.items()), ranges
