"""What ``FLAKY:`` says of a first failure: where in the test it was, and its last lines
(the VM job keeps nothing else of a test that passed on its rerun)."""

from __future__ import annotations

from pathlib import Path

from tests.support.daemon import log_tail
from tests.support.flaky import WHY_LINES, why

LONG = """\
    def test_x(tmp_path):
        with running_daemon(tmp_path) as d:
>           r = d.invoke("shell", {"command": "echo back"})

tests/faults/test_docker.py:97:""" + " \n" + "\n".join(f"filler {i}" for i in range(200)) + """
/venv/lib/python3.11/site-packages/httpcore/_backends/sync.py:128: in read
E   Failed: Timeout (>300.0s) from pytest-timeout.
E   the daemon's log (daemon-1.log), last 1 lines:
E     | ERROR engine watch: gone"""

SHORT = """\
tests/faults/test_docker.py:97: in test_engine_goes_away_and_comes_back
    r = _shell(d, "echo back")
tests/faults/test_docker.py:51: in _shell
    return d.invoke("shell", {"command": command})
""" + "\n".join(f"filler {i}" for i in range(200)) + "\nE   Failed: Timeout"


def test_the_test_s_own_frames_come_first_then_the_end() -> None:
    long = why(LONG).splitlines()
    assert long[0] == "tests/faults/test_docker.py:97: "
    assert long[-1].endswith("ERROR engine watch: gone")
    assert "filler 0" not in long and len(long) == 1 + WHY_LINES
    short = why(SHORT).splitlines()
    assert short[:2] == ["tests/faults/test_docker.py:97: in test_engine_goes_away_and_comes_back",
                         "tests/faults/test_docker.py:51: in _shell"]
    assert short[-1] == "E   Failed: Timeout"


def test_a_daemon_log_tail_is_bounded(tmp_path: Path) -> None:
    log = tmp_path / "daemon-1.log"
    log.write_text("".join(f"line {i} " + "x" * 500 + "\n" for i in range(100)))
    tail = log_tail(log, lines=3).splitlines()
    assert tail[0] == "the daemon's log (daemon-1.log), last 3 lines:"
    assert [t.split()[2] for t in tail[1:]] == ["97", "98", "99"]
    assert all(len(t) <= 305 for t in tail)
    assert "No such file" in log_tail(tmp_path / "missing.log")
