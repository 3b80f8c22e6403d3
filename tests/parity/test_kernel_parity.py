"""Every session language keeps every promise Python's kernel keeps: the table of
:mod:`tests.parity.kernel_rows` (values, errors, streamed and displayed order, interrupts that
keep the state, and code deaf to them killed with its kernel lost), each row run for each
language it applies to, through a real daemon and a real Docker engine (the container
backend's kernels)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.container.conftest import labelled
from tests.container.test_http import daemon_env
from tests.support.kernel_daemon import KernelDaemon, kernel_daemon
from tests.support.order import check_order, stream, stream_order

from .kernel_rows import LANGUAGES, ROWS, STREAMED, Language, Row

pytestmark = pytest.mark.timeout(300)

POLICY = """\
version: 1
name: kernel-parity
clients: ["*"]
limits: {timeout: 30s, max_timeout: 60s, memory: 256Mi, max_memory: 1Gi, cpus: 1.0,
         max_cpus: 2, pids: 64, max_pids: 256, output: 1Mi, max_output: 8Mi}
network: none
tools:
  python:
    backend: container
    imports: {allow: [time, sys]}
  shell:
    backend: container
    commands: {allow: [echo, sleep, mkdir]}
  bash:
    backend: container
  javascript:
    backend: container
"""

#: the grace an interrupted kernel gets (seconds; the daemon's kernel_interrupt_grace_s)
GRACE_S = 2

CASES = [pytest.param(lang, row, id=f"{lang.tool}-{row}")
         for lang in LANGUAGES.values() for row in ROWS if isinstance(lang.rows[row], Row)]


@pytest.fixture(scope="module")
def daemon(docker_client: Any, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[KernelDaemon]:
    env = {**daemon_env(""), "SANDBOXD_KERNEL_INTERRUPT_GRACE_S": str(GRACE_S)}
    with kernel_daemon(tmp_path_factory.mktemp("parity"), POLICY, "parity", env) as d:
        yield d
    assert labelled(docker_client, d.instance) == []


def _field(result: dict[str, Any], path: str) -> Any:
    value: Any = result
    for part in path.split("."):
        value = value[part]
    return value


def _holds(result: dict[str, Any], row: Row) -> None:
    """``result`` holds what the row says, besides the row's own checks."""
    for path, want in row.fields.items():
        assert _field(result, path) == want, (path, result)
    if row.stderr_has is not None:
        assert row.stderr_has in result["stderr"], result


def _state(daemon: KernelDaemon, lang: Language, sid: str) -> dict[str, Any]:
    return daemon.call(lang.tool, lang.read, sid)


def test_every_language_answers_every_row() -> None:
    """A language leaves no row unanswered: its code, or why the row does not apply."""
    for lang in LANGUAGES.values():
        assert set(lang.rows) == set(ROWS), lang.tool
        for row, entry in lang.rows.items():
            assert isinstance(entry, Row) or entry.strip(), (lang.tool, row)


@pytest.mark.parametrize(("lang", "name"), CASES)
def test_a_kernel_keeps_the_promise_of_each_row(daemon: KernelDaemon, lang: Language,
                                                 name: str) -> None:
    row = lang.rows[name]
    assert isinstance(row, Row)
    sid = daemon.session()
    planted = daemon.call(lang.tool, lang.plant, sid)
    assert planted["status"] == "ok" and planted["kernel"]["fresh"] is True, planted
    assert _state(daemon, lang, sid)["stdout"] == "kept\n"
    if name in ("value", "error"):
        result = daemon.call(lang.tool, row.code, sid)
        _holds(result, row)
        assert result["kernel"]["lost"] is False, result
    elif name in ("stream", "display"):
        events = stream(daemon.d.url, daemon.d.headers,
                        {"arguments": {"code": row.code}, "session": sid}, lang.tool)
        if name == "display":
            result = check_order(events, row.last_shown)
        else:
            result = events[-1][1]
            assert events[-1][0] == "result" and result["status"] == "ok", events
            assert stream_order(events) == STREAMED, events
            for kind in ("stdout", "stderr"):  # the result keeps each stream whole
                assert result[kind] == "".join(t for k, t in STREAMED if k == kind), result
        _holds(result, row)
    elif name in ("runaway", "sleeping"):
        result = daemon.call(lang.tool, row.code, sid, timeout_s=2)
        assert result["status"] == "timeout", result
        assert result["termination"]["reason"] == "wall_timeout", result
        assert result["kernel"] == {"fresh": False, "calls": 3, "lost": False, "reason": None,
                                    "interrupted": True}, result
        assert result["cleanup"]["verified"] is True, result
        assert "never" not in result["stdout"], result
        _holds(result, row)
    else:
        assert name == "deaf", name
        result = daemon.call(lang.tool, row.code, sid, timeout_s=1)
        assert result["status"] == "timeout", result
        assert result["kernel"] == {"fresh": False, "calls": 3, "lost": True,
                                    "reason": "wall_timeout", "interrupted": False}, result
        assert f"did not come back from the interrupt within {GRACE_S} s" \
            in result["message"], result
        assert result["resources"]["wall_ms"] >= GRACE_S * 1000, result
        assert result["cleanup"]["verified"] is True, result
        _holds(result, row)
        fresh = _state(daemon, lang, sid)
        assert fresh["stdout"] == "gone\n" and fresh["kernel"]["fresh"] is True, fresh
        daemon.close(sid)
        return
    after = _state(daemon, lang, sid)  # the state outlived the row's call
    assert after["stdout"] == "kept\n" and after["kernel"]["lost"] is False, after
    daemon.close(sid)
