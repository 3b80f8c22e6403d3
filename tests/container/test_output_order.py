"""Execution order (a reader sees each output where it happened) on the container backend (real
daemon, real Docker, the image under test): prints and display items keep execution order in the SSE
stream and in the result, one-shot and in a session kernel, although the runner reads stdout, stderr
and display items from three pipes; a failed call's message is its exception line and its traceback
shows the failing source line (as on the restricted backend: tests/api/test_output_order.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.kernel_daemon import kernel_daemon
from tests.support.order import ORDER_CODE, check_order, stream

from .conftest import labelled
from .test_http import daemon_env
from .test_kernel import POLICY, Daemon

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = pytest.mark.same_on_every_host(
    "the order of a call's prints and display items: the runner's pipes and the daemon's stream "
    "protocol; no limit, cgroup, mount or namespace is asserted (the container lane starts the "
    "same daemon and containers)")


@pytest.fixture(scope="module")
def daemon(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with kernel_daemon(tmp_path_factory.mktemp("order"), POLICY, "ord", daemon_env(""),
                       ("alice",)) as k:
        yield Daemon(k.d, k.instance, k.keys)
    assert labelled(docker_client, k.instance) == []


def test_prints_and_displays_keep_their_order(daemon: Daemon) -> None:
    for _ in range(3):  # the runner's three pipes: each run may interleave them differently
        events = stream(daemon.d.url, daemon.auth("alice"), {"arguments": {"code": ORDER_CODE}})
        assert check_order(events)["backend"] == "container"


def test_a_session_kernel_keeps_the_order_too(daemon: Daemon) -> None:
    sid = daemon.session()
    body = {"arguments": {"code": ORDER_CODE}, "session": sid}
    for calls in (1, 2, 3):
        result = check_order(stream(daemon.d.url, daemon.auth("alice"), body))
        assert result["kernel"]["calls"] == calls, result


@pytest.mark.parametrize("session", [False, True])
def test_an_error_names_its_line_and_sets_the_message(daemon: Daemon, session: bool) -> None:
    sid = daemon.session() if session else None
    result = daemon.py("x = 1\ny = x / 0\n", sid)
    assert result["status"] == "error", result
    assert result["message"] == "ZeroDivisionError: division by zero", result
    assert "line 2" in result["stderr"] and "y = x / 0" in result["stderr"], result


def test_a_rich_last_value_is_read_once_after_the_prints(daemon: Daemon) -> None:
    from sandboxd.models import Result
    from sandboxd_client.render import format_result

    code = ("class T:\n    def _repr_html_(self):\n        return '<b>t</b>'\n"
            "    def __repr__(self):\n        return 'T(rows=1)'\nprint('x')\nT()")
    for sid in (None, daemon.session()):
        result = daemon.py(code, sid)
        assert result["status"] == "ok" and result["value"] == "T(rows=1)", result
        assert format_result(Result.model_validate(result)) == "stdout:\nx\ndisplay:\nT(rows=1)"
