"""The zygote forks its workers with libc's ``fork()``, skipping Python's at-fork handlers
(see ``sandboxd/backends/restricted/forking.py``): what those handlers did that a worker needs
must still hold, and the zygote must refuse to fork that way with a second thread."""

from __future__ import annotations

import threading

import pytest

from sandboxd.backends.restricted import forking
from sandboxd.models import Status
from tests.restricted.conftest import BackendHarness


def test_sibling_workers_draw_their_own_random_numbers(harness: BackendHarness) -> None:
    # without the worker's own reseed every worker would continue the zygote's sequence
    drawn = []
    for _ in range(3):
        res = harness.run("import random\nprint(random.getrandbits(64))")
        assert res.status is Status.ok, res
        drawn.append(res.stdout)
    assert len(set(drawn)) == 3, drawn


def test_bare_fork_refused_beside_a_second_thread() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        with pytest.raises(RuntimeError, match="single-threaded"):
            forking.check_single_threaded()
    finally:
        stop.set()
        thread.join()
