"""The VM job runs one pytest per lane (tests/vm/guest/test-suite.sh); its summary still has
a line per entry, read from the lane's junit XML by tests/vm/guest/lane-summary.py. Here a
real pytest run over two directories and a glob of a third's files gives that XML."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "vm" / "guest" / "lane-summary.py"


def _lane(tmp_path: Path) -> Path:
    tests = tmp_path / "tests"
    for d, body in {
        "alpha": "def test_ok(): pass\ndef test_bad(): assert False\n",
        # junit reports an expected failure as <skipped>: the job counts it as one
        "beta": "import pytest\ndef test_ok(): pass\n"
                "@pytest.mark.xfail(strict=True)\ndef test_expected(): assert False\n",
        "gamma": "def test_ok(): pass\n",
    }.items():
        (tests / d).mkdir(parents=True)
        (tests / d / f"test_{d}.py").write_text(body)
    (tests / "gamma" / "test_other.py").write_text("class TestC:\n    def test_ok(self): pass\n")
    xml = tmp_path / "lane0.xml"
    share = [str(p.relative_to(tmp_path)) for p in sorted(tests.glob("gamma/test_o*"))]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          f"--junitxml={xml}", "tests/alpha", "tests/beta", *share],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "1 failed, 3 passed, 1 xfailed" in run.stdout, run.stdout + run.stderr
    return xml


def _summary(*args: str) -> tuple[list[list[str]], int]:
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                         text=True, timeout=60)
    return [line.split("\t") for line in run.stdout.splitlines()], run.returncode


def test_a_line_per_entry_then_the_lanes(tmp_path: Path) -> None:
    xml = _lane(tmp_path)
    lines, status = _summary(str(xml), "lane0", "42", "1", "alpha", "beta", "gamma/test_o*")
    counts = {line[0]: (line[1:5], line[6]) for line in lines}
    assert counts == {
        "alpha": (["1", "1", "0", "0"], "1"),
        "beta": (["1", "0", "0", "1"], "1"),  # a skip fails the entry (the job allows none)
        "gamma/test_o*": (["1", "0", "0", "0"], "0"),  # test_other only, its class included
        "lane0": (["3", "1", "0", "1"], "1"),
    }
    assert lines[-1][5] == "42"  # the lane's wall time
    assert status == 1  # a test was skipped


def test_a_clean_lane_and_a_missing_xml(tmp_path: Path) -> None:
    xml = _lane(tmp_path)
    lines, status = _summary(str(xml), "lane1", "7", "0", "gamma/test_o*")
    # tests of no entry (alpha's, beta's) are counted apart, never dropped
    assert [line[0] for line in lines] == ["gamma/test_o*", "(other)", "lane1"]
    lines, status = _summary(str(tmp_path / "none.xml"), "lane1", "7", "0", "alpha")
    assert lines == [["alpha", "?", "?", "?", "?", "?", "?"],
                     ["lane1", "?", "?", "?", "?", "7", "1"]]
    assert status == 0
