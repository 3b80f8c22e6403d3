"""The tests' one check that a sandbox process is still there (``tests.support.processes``)."""

from __future__ import annotations

import subprocess
import sys

import psutil

from tests.support.processes import running
from tests.support.wait import wait_until


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_live_process_runs() -> None:
    child = _sleeper()
    try:
        assert running(child.pid)
        assert running(psutil.Process(child.pid))
    finally:
        child.kill()
        child.wait()


def test_a_zombie_does_not_run() -> None:
    child = _sleeper()
    child.kill()
    wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE,  # not reaped
               timeout=10, interval=0.01, what="the killed child to become a zombie")
    try:
        assert not running(child.pid)
    finally:
        child.wait()


def test_a_process_that_ended_between_two_looks_is_an_answer_not_an_error() -> None:
    child = _sleeper()
    seen = psutil.Process(child.pid)  # looked up while it ran
    child.kill()
    child.wait()  # reaped: its pid is free
    assert not running(seen)
    assert not running(child.pid)
