"""The proof from outside that a kernel is idle (its own word cannot be
trusted; ``sandboxd.backends.restricted.idle``)
on real processes: parked in ``read`` on the right descriptor with every caught signal blocked
is idle; running, sleeping elsewhere, wakeable by a signal it catches, another descriptor, or
ended is not."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from sandboxd.backends.restricted import idle
from tests.support.wait import wait_until

PARKED = """
import os, signal, sys
fd = int(sys.argv[1])
if sys.argv[2] == "catches":
    signal.signal(signal.SIGUSR1, lambda *a: None)
else:
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
os.read(fd, 1)
"""


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        os.close(fd)


def spawn(code: str, *args: str, fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code, *args], pass_fds=fds)


def finish(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()


def test_parked_in_read_with_signals_blocked_is_idle(pipe: tuple[int, int]) -> None:
    r, w = pipe
    proc = spawn(PARKED, str(r), "blocks", fds=(r,))
    try:
        wait_until(lambda: idle.not_idle_because(proc.pid, r, None) is None, timeout=30,
                   what="the child to park", detail=lambda: idle.not_idle_because(proc.pid, r,
                                                                                  None))
        # the same process is not idle on another descriptor's account
        assert idle.not_idle_because(proc.pid, r + 100, None) is not None
        os.write(w, b"x")  # its request: it leaves the read and ends
        proc.wait(timeout=30)
        assert idle.not_idle_because(proc.pid, r, None) == idle.GONE
    finally:
        finish(proc)


def test_a_caught_signal_left_unblocked_could_wake_it(pipe: tuple[int, int]) -> None:
    r, _w = pipe
    proc = spawn(PARKED, str(r), "catches", fds=(r,))
    try:
        why = wait_until(
            lambda: (idle.not_idle_because(proc.pid, r, None) or "").startswith("a signal")
            and idle.not_idle_because(proc.pid, r, None), timeout=30,
            what="the child to wait in read with SIGUSR1 caught")
        assert "signal it catches" in str(why)
    finally:
        finish(proc)


@pytest.mark.parametrize(("code", "says"), [
    ("while True:\n    pass", "it is running"),
    ("import time\ntime.sleep(60)", "not waiting for its next request"),
])
def test_running_or_sleeping_elsewhere_is_not_idle(code: str, says: str) -> None:
    proc = spawn(code)
    try:
        wait_until(lambda: says in (idle.not_idle_because(proc.pid, 0, None) or ""),
                   timeout=30, what=f"the child to be seen as: {says}",
                   detail=lambda: idle.not_idle_because(proc.pid, 0, None))
    finally:
        finish(proc)


async def test_prove_idle_gives_up_at_once_on_an_ended_process() -> None:
    proc = spawn("pass")
    proc.wait(timeout=30)
    start = time.monotonic()
    assert await idle.prove_idle(proc.pid, 0, None, start + 30) == idle.GONE
    assert time.monotonic() - start < 5  # not the 30 s deadline: a hang is what this catches
