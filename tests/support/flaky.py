"""Reruns in plain sight (issue 28): CI reruns a failed test once (``--reruns 1``, from
pytest-rerunfailures, CI only) and every rerun is named at the end of the run as
``FLAKY: <test id>``, so that one unlucky timing costs no change and no flake stays silent.
A test that fails twice fails the run. ``SANDBOXD_FLAKY_FILE``: the lines are appended there
too, for ``.ci/run``'s closing summary (the VM job writes them to its results)."""

from __future__ import annotations

import os

import pytest

#: the test ids that needed a rerun in this session, in order
RERUNS: list[str] = []


def note(report: pytest.TestReport) -> None:
    """Remember a test whose call was rerun (pytest-rerunfailures' ``rerun`` outcome)."""
    if report.outcome == "rerun" and report.nodeid not in RERUNS:
        RERUNS.append(report.nodeid)


def summary(terminal: pytest.TerminalReporter) -> None:
    """Name every rerun test (``FLAKY: id``) at the end of the run and in the flaky file."""
    if not RERUNS:
        return
    lines = [f"FLAKY: {nodeid}" for nodeid in RERUNS]
    terminal.section("flaky tests (failed once, rerun)", sep="=", yellow=True)
    for line in lines:
        terminal.write_line(line)
    path = os.environ.get("SANDBOXD_FLAKY_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
