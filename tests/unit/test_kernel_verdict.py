"""The verdict on a session kernel call, row by row: what a backend observed -> the Kernel its
result reports, the cleanup detail of a kept kernel and the sentence of a lost one. Every
branch either backend takes is a row (no process runs: the verdict is pure); the strings are
the ones results carried before the verdict had a module of its own."""

from __future__ import annotations

import pytest

from sandboxd.backends.kernel_verdict import (
    KEPT,
    KEPT_CANCELLED,
    KEPT_INTERRUPTED,
    LEFT,
    Ended,
    Observed,
    Verdict,
    kernel_verdict,
)
from sandboxd.models import Kernel, Reason

FIN, CANCEL, TIMEOUT, THAW = Ended.FINISHED, Ended.CANCELLED, Ended.TIMEOUT, Ended.THAW_FAILED

ROWS: list[tuple[str, Observed, Verdict]] = [
    # kept: back in its loop, proven idle
    ("restricted: ended within every limit, kept",
     Observed(FIN, False, 3, back=True),
     Verdict(Kernel(calls=3), detail=KEPT)),
    ("restricted: a fresh kernel's first call, kept",
     Observed(FIN, True, 1, back=True),
     Verdict(Kernel(fresh=True, calls=1), detail=KEPT)),
    ("both: interrupted at the deadline or on request, came back",
     Observed(FIN, False, 2, back=True, interrupted=True),
     Verdict(Kernel(calls=2, interrupted=True), detail=KEPT_INTERRUPTED)),
    ("container: interrupted and back, the call's processes not proven gone",
     Observed(FIN, True, 1, back=True, interrupted=True, verified=False),
     Verdict(Kernel(fresh=True, calls=1, interrupted=True), detail=LEFT)),
    ("both: cancelled, interrupted, came back",
     Observed(CANCEL, False, 4, back=True, interrupted=True),
     Verdict(Kernel(calls=4, interrupted=True), detail=KEPT_INTERRUPTED)),
    ("container: cancelled, the call ended by itself as it was interrupted",
     Observed(CANCEL, False, 4, back=True),
     Verdict(Kernel(calls=4), detail=KEPT_CANCELLED)),
    ("container: cancelled and kept, the call's processes not proven gone",
     Observed(CANCEL, False, 4, back=True, verified=False),
     Verdict(Kernel(calls=4), detail=LEFT)),
    ("container: a runner without kernels ran it one-shot",
     Observed(FIN, False, 0, back=True, old_runner="sandboxd/python:3"),
     Verdict(Kernel(fresh=True, calls=1, lost=True, reason="unsupported"),
             message="the runner of the sandbox image sandboxd/python:3 predates session "
                     "kernels, so Python state is not kept between calls; rebuild the image "
                     "(sandboxd images build)")),
    # lost before the call came to a result of its own
    ("both: cancelled, not back: killed",
     Observed(CANCEL, True, 1),
     Verdict(Kernel(fresh=True, calls=1, lost=True, reason="cancelled"))),
    ("both: cancelled while the kernel was ended from outside: still cancelled",
     Observed(CANCEL, False, 2, stopped="restarted"),
     Verdict(Kernel(calls=2, lost=True, reason="cancelled"))),
    ("container: the deadline passed with no answer",
     Observed(TIMEOUT, False, 5),
     Verdict(Kernel(calls=5, lost=True, reason="wall_timeout"))),
    ("container: the paused container could not be thawed",
     Observed(THAW, False, 2),
     Verdict(Kernel(calls=2, lost=True, reason="thaw_failed"))),
    ("container: a session call with no kernel to speak of",
     Observed(TIMEOUT, False, 0, has_kernel=False),
     Verdict(None)),
    ("container: no kernel, even when the runner was old",
     Observed(FIN, False, 0, has_kernel=False, old_runner="img"),
     Verdict(None)),
    # lost with a result of its own
    ("restricted: ended from outside during the call (its own reason)",
     Observed(FIN, False, 2, stopped="the session was closed",
              termination=Reason.exited, crashed=True),
     Verdict(Kernel(calls=2, lost=True, reason="the session was closed"))),
    ("container: restarted during the call",
     Observed(FIN, False, 2, stopped="restarted", crashed=True, signal=9),
     Verdict(Kernel(calls=2, lost=True, reason="restarted"),
             why="the session's kernel was restarted during the call")),
    ("container: not idle after its report (a thread left running)",
     Observed(FIN, False, 2, not_idle="1 thread still running", crashed=True),
     Verdict(Kernel(calls=2, lost=True, reason="not_idle"),
             why="the Python interpreter was not idle after the call: 1 thread still running")),
    ("container: the interpreter was killed by a signal",
     Observed(FIN, True, 1, crashed=True, signal=11, exit_code=None),
     Verdict(Kernel(fresh=True, calls=1, lost=True, reason="crashed"),
             why="the Python interpreter was killed by signal 11")),
    ("container: the interpreter exited",
     Observed(FIN, False, 3, crashed=True, exit_code=3),
     Verdict(Kernel(calls=3, lost=True, reason="crashed"),
             why="the Python interpreter exited with status 3")),
    ("restricted: the worker exited (crashed)",
     Observed(FIN, False, 3, crashed=True, termination=Reason.exited),
     Verdict(Kernel(calls=3, lost=True, reason="crashed"))),
    ("restricted: not proven idle after its report: killed at the deadline",
     Observed(FIN, False, 2, termination=Reason.wall_timeout),
     Verdict(Kernel(calls=2, lost=True, reason="wall_timeout"))),
    ("both: a limit ended the call (memory)",
     Observed(FIN, True, 1, termination=Reason.memory_limit),
     Verdict(Kernel(fresh=True, calls=1, lost=True, reason="memory_limit"))),
    ("both: interrupted but not back within the grace",
     Observed(FIN, False, 6, interrupted=True, termination=Reason.cancelled),
     Verdict(Kernel(calls=6, lost=True, reason="cancelled"))),
    ("container: the container went, its exit said exited (not mapped to crashed)",
     Observed(FIN, False, 2, termination=Reason.exited),
     Verdict(Kernel(calls=2, lost=True, reason="exited"))),
    ("a result that names no termination: crashed",
     Observed(FIN, False, 2, exit_code=1),
     Verdict(Kernel(calls=2, lost=True, reason="crashed"),
             why="the Python interpreter exited with status 1")),
]


@pytest.mark.parametrize(("seen", "expected"), [(s, v) for _, s, v in ROWS],
                         ids=[name for name, _, _ in ROWS])
def test_the_verdict_of_each_observation(seen: Observed, expected: Verdict) -> None:
    got = kernel_verdict(seen)
    assert got == expected
    # what the result carries: the Kernel's JSON, byte for byte
    assert _json(got) == _json(expected)


def _json(verdict: Verdict) -> str | None:
    return None if verdict.kernel is None else verdict.kernel.model_dump_json()


def test_a_kept_kernel_is_never_lost_and_a_lost_one_always_says_why() -> None:
    for _, seen, _ in ROWS:
        kernel = kernel_verdict(seen).kernel
        if kernel is None:
            continue
        assert kernel.lost == (kernel.reason is not None)
        assert not (kernel.lost and kernel.interrupted)


def test_the_kept_details_are_the_ones_results_carried() -> None:
    assert KEPT == "the session's kernel was kept for its next call"
    assert KEPT_INTERRUPTED == (
        "the call's code was interrupted and the kernel came back to its loop (proven idle): "
        "it was kept for the session's next call")
    assert KEPT_CANCELLED == ("the call ended as it was cancelled; the session's kernel was "
                              "kept for its next call")
    assert LEFT == "processes of the call may be left"
