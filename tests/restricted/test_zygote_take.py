"""A take (``t``) raises the zygote's standby target even when the taken worker already exited
and was reaped: a short call under load can end before the zygote reads the message, and the
idle standby count then stayed at one (FLAKY in tests/restricted/test_idle_standby.py)."""

from __future__ import annotations

from types import SimpleNamespace

from sandboxd.backends.restricted.zygote import Zygote
from sandboxd.backends.restricted.zygote_protocol import CTRL


def zygote_state() -> SimpleNamespace:
    """What :meth:`Zygote.handle` reads and writes: no worker listed (the taken one was reaped)."""
    return SimpleNamespace(workers={}, standby_target=1, standby_max=4, preset=(0, 0.0, 0))


def test_a_take_of_a_reaped_worker_raises_the_target_and_sets_the_preset() -> None:
    z = zygote_state()
    Zygote.handle(z, CTRL.pack(b"t", 4242, 256 << 20, 1.0, 64))  # type: ignore[arg-type]
    assert z.standby_target == 4
    assert z.preset == (256 << 20, 1.0, 64)


def test_a_probe_take_of_a_reaped_worker_leaves_the_target() -> None:
    z = zygote_state()
    Zygote.handle(z, CTRL.pack(b"u", 4242, 256 << 20, 1.0, 64))  # type: ignore[arg-type]
    assert z.standby_target == 1
