"""Execution order (a reader sees each output where it happened) on the restricted backend (real
daemon, default policy): prints and display items keep execution order in the SSE stream and in the
result (each item's position), one-shot and in a session kernel; a failed call's message is its
exception line and its traceback shows the failing source line."""

from __future__ import annotations

import pytest

from tests.support.daemon import RunningDaemon
from tests.support.order import ORDER_CODE, check_order, stream


@pytest.fixture
def daemon(module_daemon: RunningDaemon) -> RunningDaemon:
    """This module's tests share one daemon (tests/conftest.py: module_daemon)."""
    return module_daemon


def test_prints_and_displays_keep_their_order(daemon: RunningDaemon) -> None:
    result = check_order(stream(daemon.url, daemon.headers, {"arguments": {"code": ORDER_CODE}}))
    assert result["backend"] == "restricted"


def test_a_session_kernel_keeps_the_order_too(daemon: RunningDaemon) -> None:
    sid = daemon.client.post("/v1/sessions").json()["id"]
    body = {"arguments": {"code": ORDER_CODE}, "session": sid}
    check_order(stream(daemon.url, daemon.headers, body))
    second = check_order(stream(daemon.url, daemon.headers, body))
    assert second["kernel"]["calls"] == 2, second


def test_an_error_names_its_line_and_sets_the_message(daemon: RunningDaemon) -> None:
    r = daemon.invoke("python", {"code": "x = 1\ny = x / 0\n"})
    result = r.json()
    assert result["status"] == "error", result
    assert result["message"] == "ZeroDivisionError: division by zero", result
    assert "line 2" in result["stderr"] and "y = x / 0" in result["stderr"], result
