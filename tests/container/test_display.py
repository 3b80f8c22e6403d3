"""Rich results on the container backend (base image): ``display()`` by IPython's
conventions, one-shot and in a session kernel, through the real daemon and Docker engine;
and a user process that writes garbage on its display pipe gets nothing past the runner and
the daemon, and breaks nothing but its own call."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import cli
from tests.support.kernel_daemon import kernel_daemon

from .conftest import labelled
from .test_http import daemon_env
from .test_kernel import POLICY, Daemon

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = pytest.mark.same_on_every_host(
    "display items and output streams: the runner's pipes, its display cap and the daemon's "
    "parsing of what comes back, as test_output_order; no limit, cgroup, mount or namespace "
    "is asserted (test_confinement and test_limits run the same containers in the VM)")

RICH = """\
class Table:
    def _repr_html_(self):
        return '<table><tr><td>1</td></tr></table>'
    def __repr__(self):
        return 'Table(1 row)'
class Broken:
    def _repr_html_(self):
        raise RuntimeError('no html today')
    def __repr__(self):
        return 'Broken()'
print('a')
display(Table(), {'k': [1, 2]})
print('b')
display(Broken())
Table()
"""

#: every inherited pipe fd above 2 gets bytes that are no frame at all
GARBAGE = """\
import os
for name in os.listdir('/proc/self/fd'):
    if int(name) > 2:
        try:
            os.write(int(name), b'Z' * 64 + bytes(9))
        except OSError:
            pass
print('wrote')
"""


@pytest.fixture(scope="module")
def daemon(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with kernel_daemon(tmp_path_factory.mktemp("display"), POLICY, "disp", daemon_env(""),
                       ("alice", "bob")) as k:
        yield Daemon(k.d, k.instance, k.keys)
    assert labelled(docker_client, k.instance) == []


def _expected_rich(outputs: list[dict[str, Any]]) -> None:
    assert [o["data"] for o in outputs] == [
        {"text/html": "<table><tr><td>1</td></tr></table>", "text/plain": "Table(1 row)"},
        {"text/plain": "{'k': [1, 2]}", "application/json": {"k": [1, 2]}},
        {"text/plain": "Broken()"},  # a failing _repr_html_ is skipped, repr stays
        {"text/html": "<table><tr><td>1</td></tr></table>", "text/plain": "Table(1 row)"},
    ]


def test_display_one_shot_by_ipython_conventions(daemon: Daemon) -> None:
    res = daemon.py(RICH)
    assert res["status"] == "ok", res
    assert res["stdout"] == "a\nb\n"
    assert res["value"] == "Table(1 row)"  # the rich last value is displayed too
    _expected_rich(res["outputs"])


def test_display_in_a_session_kernel(daemon: Daemon) -> None:
    sid = daemon.session()
    first = daemon.py("rows = [1, 2]\ndisplay(rows)", sid)
    assert first["status"] == "ok", first
    second = daemon.py(RICH, sid)
    assert second["status"] == "ok" and second["kernel"]["calls"] == 2, second
    assert [o["data"] for o in first["outputs"]] == [
        {"text/plain": "[1, 2]", "application/json": [1, 2]}]
    _expected_rich(second["outputs"])
    third = daemon.py("display(len(rows))", sid)  # the count starts again for every call
    assert [o["data"] for o in third["outputs"]] == [
        {"text/plain": "2", "application/json": 2}], third


def test_the_count_cap_holds_in_the_runner(daemon: Daemon) -> None:
    res = daemon.py("for i in range(100):\n    display(i)")
    assert res["status"] == "ok", res
    assert len(res["outputs"]) == 33  # 32 items, then the one note
    assert res["outputs"][-1]["truncated"] is True


def test_garbage_on_the_display_pipe_fails_that_call_only(daemon: Daemon) -> None:
    res = daemon.py(GARBAGE)
    assert res["status"] == "error", res
    assert "display()" in (res["message"] or ""), res
    assert res["outputs"] == []
    sid = daemon.session()
    assert daemon.py("x = 1", sid)["status"] == "ok"
    lost = daemon.py(GARBAGE, sid)
    assert lost["status"] == "error" and lost["kernel"]["lost"] is True, lost
    assert lost["outputs"] == []
    after = daemon.py("display('fine')", sid)  # a fresh kernel, display works again
    assert after["status"] == "ok" and after["kernel"]["fresh"] is True, after
    assert [o["data"] for o in after["outputs"]] == [
        {"text/plain": "'fine'", "application/json": "fine"}]
    assert daemon.py("display(2)")["outputs"][0]["data"] == {"text/plain": "2",
                                                             "application/json": 2}


def test_the_cli_saves_a_calls_images(daemon: Daemon, tmp_path: Path) -> None:
    from tests.unit.test_outputs import tiny_png

    png = tiny_png(4, 3)
    code = (f"class Img:\n    def _repr_png_(self):\n        return {png!r}\n"
            "display(Img())")
    r = cli.run("invoke", "python", "--json", json.dumps({"code": code}), "--url",
                daemon.d.url, "--save-outputs", str(tmp_path), timeout=120,
                env={**os.environ, "SANDBOXD_TOKEN": daemon.keys["alice"]})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("[display] [image: 4x3 png]"), r.stdout
    assert (tmp_path / "display-1.png").read_bytes() == png  # the same bytes that went in


def test_output_streams_from_a_container_one_shot_and_in_its_kernel(daemon: Daemon) -> None:
    from tests.api.test_stream import PRINT_SLEEP_PRINT, stream, text_of

    sid = daemon.session()
    for session in (None, sid, sid):
        body: dict[str, Any] = {"arguments": {"code": PRINT_SLEEP_PRINT + "\ndisplay(1)"}}
        if session:
            body["session"] = session
        events = stream(daemon.d, body)
        result_at, kind, result = events[-1]
        assert kind == "result" and result["status"] == "ok", result
        first_stdout = next(t for t, k, _ in events if k == "stdout")
        assert result_at - first_stdout >= 0.8
        assert text_of(events, "stdout") == result["stdout"] == "a\nb\n"
        assert [d for _, k, d in events if k == "display"] == result["outputs"]
    assert result["kernel"]["calls"] == 2
