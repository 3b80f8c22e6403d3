"""What the invoke path says on a result after its backend ran is one ordered list of steps
(:mod:`sandboxd.invoke.steps`): the kernel's own loss or interrupt first, a full workspace in
front of the message, a restart that ended the previous kernel appended. Each step alone, and
the list's order, which is the wording the model reads."""

from __future__ import annotations

from functools import partial

from sandboxd.invoke.steps import (
    QuotaSeen,
    Step,
    finish,
    kernel_lost,
    result_steps,
    workspace_full,
)
from sandboxd.models import (
    KERNEL_INTERRUPTED_MESSAGE,
    Kernel,
    Reason,
    Result,
    kernel_lost_message,
)
from sandboxd.sessions.restarts import CRASH_MESSAGE, DAEMON_CRASH, note_restart
from sandboxd.workspaces.quota import Usage, quota_message

QUOTA = Usage(0, 0, 1 << 20, 100)
FULL = Usage(1 << 20, 10, 1 << 20, 100)


def _result(message: str | None = None, kernel: Kernel | None = None,
            stderr: str = "") -> Result:
    result = Result.build(("inv_1", "python", "ses_1"), "python", Reason.exited, exit_code=1,
                          message=message, stderr=stderr)
    return result.model_copy(update={"kernel": kernel})


def _names(steps: list[Step]) -> list[str]:
    return [getattr(s, "func", s).__name__ for s in steps]


def test_the_steps_are_in_their_order() -> None:
    assert _names(result_steps()) == ["kernel_lost"]
    assert _names(result_steps(quota=QuotaSeen(FULL, QUOTA))) == ["kernel_lost",
                                                                   "workspace_full"]
    assert _names(result_steps(restart=DAEMON_CRASH)) == ["kernel_lost", "note_restart"]
    assert _names(result_steps(quota=QuotaSeen(None, QUOTA), restart=DAEMON_CRASH)) == [
        "kernel_lost", "workspace_full", "note_restart"]


def test_the_order_is_the_wording() -> None:
    interrupted = _result(kernel=Kernel(calls=2, interrupted=True))
    said = finish(interrupted, result_steps(quota=QuotaSeen(FULL, QUOTA), restart=DAEMON_CRASH))
    assert said.message == (f"{quota_message(FULL)} ({KERNEL_INTERRUPTED_MESSAGE}); "
                            f"{CRASH_MESSAGE}")
    assert said.kernel is not None and said.kernel.lost and said.kernel.reason == DAEMON_CRASH


def test_kernel_lost_says_it_once() -> None:
    lost = _result("the memory limit was reached", Kernel(lost=True, reason="memory_limit"))
    said = kernel_lost(lost)
    assert said.message == kernel_lost_message(lost)
    assert kernel_lost(said) is said  # said already
    kept = _result(kernel=Kernel(calls=3))
    assert kernel_lost(kept) is kept
    interrupted = kernel_lost(_result("cut", Kernel(interrupted=True)))
    assert interrupted.message == f"cut; {KERNEL_INTERRUPTED_MESSAGE}"
    assert kernel_lost(interrupted) is interrupted


def test_workspace_full_reads_the_workspace_or_the_output() -> None:
    full = workspace_full(QuotaSeen(FULL, QUOTA), _result("exit 1"))
    assert full.message == f"{quota_message(FULL)} (exit 1)"
    # gone with its sandbox (not measured): the output tail is all there is to go by
    enospc = workspace_full(QuotaSeen(None, QUOTA), _result(stderr="OSError: No space left on "
                                                                   "device"))
    assert enospc.message == quota_message(QUOTA)
    room = _result("exit 1")
    assert workspace_full(QuotaSeen(Usage(10, 1, 1 << 20, 100), QUOTA), room) is room


def test_a_restart_is_said_only_on_a_kernel_this_call_kept() -> None:
    step = partial(note_restart, reason=DAEMON_CRASH)
    fresh = step(_result(kernel=Kernel(fresh=True, calls=1)))
    assert fresh.message == CRASH_MESSAGE and fresh.kernel is not None and fresh.kernel.lost
    lost_again = _result("x", Kernel(lost=True, reason="wall_timeout"))
    assert step(lost_again) is lost_again  # its own loss says more
    one_shot = _result()
    assert step(one_shot) is one_shot
