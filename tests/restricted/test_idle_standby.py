"""Idle standby workers (few while idle, for the daemon's idle memory): an idle zygote keeps
``IDLE_STANDBY`` standbys (each is memory the idle daemon keeps), a call raises the count to one per
scheduler slot, and once no call took one for ``IDLE_AFTER_S`` the daemon kills the surplus and the
zygote does not replace them. A readiness probe is not a call: it leaves the count as it is."""

from __future__ import annotations

import os
import secrets

import psutil
import pytest

from sandboxd.backends.restricted import zygote_client
from sandboxd.backends.restricted.zygote import STANDBY_WORKERS
from sandboxd.backends.restricted.zygote_protocol import IDLE_STANDBY
from sandboxd.models import Status
from tests.restricted.conftest import BackendHarness
from tests.support.wait import wait_until


def standbys(h: BackendHarness) -> tuple[int, int]:
    """(standbys the daemon holds, the zygote's children): both are the standby count once no
    call runs."""
    z = h.backend._zygote
    assert z is not None
    children = len(psutil.Process(z.pid).children())  # count-ok: the count under test
    return len(z.standby), children


async def restart_idle_timer(h: BackendHarness) -> None:
    """Forget the idle check the first call scheduled (an hour away): the next call schedules
    one with the patched delay (on the backend's loop: timers are not thread-safe)."""
    z = h.backend._zygote
    assert z is not None and z._idle_timer is not None
    z._idle_timer.cancel()
    z._idle_timer = None


def test_idle_keeps_one_standby_a_call_raises_the_count_and_idleness_lowers_it(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zygote_client, "IDLE_AFTER_S", 3600.0)
    state = tmp_path_factory.mktemp("idle-standby")
    os.chmod(state, 0o755)
    h = BackendHarness(state, f"t{secrets.token_hex(5)}")
    full = (min(STANDBY_WORKERS, h.settings.max_concurrency),) * 2
    idle = (IDLE_STANDBY, IDLE_STANDBY)
    assert full > idle
    try:
        wait_until(lambda: standbys(h) == idle, timeout=30, what="one standby after start-up",
                   detail=lambda: standbys(h))
        report = h.call(h.backend.probe())  # two probe calls: no raise of the count
        assert report.ok, report
        wait_until(lambda: standbys(h) == idle, timeout=30, what="one standby after a probe",
                   detail=lambda: standbys(h))
        assert h.run("print(1)").status is Status.ok
        wait_until(lambda: standbys(h) == full, timeout=30, what="the full standby count",
                   detail=lambda: standbys(h))
        # idle for IDLE_AFTER_S after the last call: the surplus goes, and is not replaced
        monkeypatch.setattr(zygote_client, "IDLE_AFTER_S", 0.5)
        h.call(restart_idle_timer(h))
        assert h.run("print(1)").status is Status.ok
        wait_until(lambda: standbys(h) == idle, timeout=30, what="one standby once idle",
                   detail=lambda: standbys(h))
        # the killed standbys were never used; the next calls find a worker as before
        for _ in range(3):
            res = h.run("print(2)")
            assert res.status is Status.ok and res.stdout == "2\n", res
            assert res.cleanup.verified
    finally:
        h.close()
