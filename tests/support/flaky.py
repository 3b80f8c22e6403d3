"""Reruns in plain sight (a flaky test must be seen, not hidden): CI reruns a failed test once
(``--reruns 1``, from pytest-rerunfailures, CI only) and every rerun is named at the end of the run
as ``FLAKY: <test id>``, so that one unlucky timing costs no change and no flake stays silent.
A test that fails twice fails the run. ``SANDBOXD_FLAKY_FILE``: the lines are appended there
too, for ``.ci/run``'s closing summary (the VM job writes them to its results)."""

from __future__ import annotations

import os
import re

import pytest

#: the test ids that needed a rerun in this session, in order
RERUNS: list[str] = []
#: why each one failed on its first try (the failure's last lines): a rerun must say why
WHY: dict[str, str] = {}
#: how many lines of each first failure the summary shows
WHY_LINES = 45
#: a frame's location line in pytest's long and short tracebacks, in the project's tests
FRAME = re.compile(r"^tests/\S+\.py:\d+:")
#: the test ids that failed after their rerun too (reported as failures, not as flaky)
FAILED: set[str] = set()


def note(report: pytest.TestReport) -> None:
    """Remember a test that was rerun (pytest-rerunfailures' ``rerun`` outcome), and whether
    its last try failed as well."""
    if report.outcome == "rerun" and report.nodeid not in RERUNS:
        RERUNS.append(report.nodeid)
        WHY[report.nodeid] = why(report.longreprtext or "")
    elif report.failed:
        FAILED.add(report.nodeid)


def why(text: str) -> str:
    """A first failure in short: where the test's own code was (each ``tests/...:N:``
    frame line) and the failure's last lines (with the daemon log's tail, when a test
    daemon added it)."""
    lines = text.splitlines()
    where = [line for line in lines if FRAME.match(line)]
    return "\n".join([*where, *lines[-WHY_LINES:]])


def summary(terminal: pytest.TerminalReporter) -> None:
    """Name every test that passed on its rerun (``FLAKY: id``) at the end of the run, and in
    the flaky file. Under pytest-xdist the controller does it (it hears every worker's
    reports), not each worker."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    lines = [f"FLAKY: {nodeid}" for nodeid in RERUNS if nodeid not in FAILED]
    if not lines:
        return
    terminal.section("flaky tests (failed once, rerun)", sep="=", yellow=True)
    for line in lines:
        terminal.write_line(line)
        why = WHY.get(line.removeprefix("FLAKY: "), "")
        for text in why.splitlines():  # why it failed the first time, so the flake can be fixed
            terminal.write_line("    " + text)
    path = os.environ.get("SANDBOXD_FLAKY_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
