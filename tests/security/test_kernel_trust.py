"""Session kernels you can trust (code in them is hostile), through the HTTP API of real daemons.

* No object the sandbox hands user code leads to the worker's result channel: ``display``,
  ``open`` and its files, ``type`` and the module proxies show only their documented surface.
* The end of a call cannot be forged: with the language layer assumed broken
  (:mod:`tests.security.language_bypass`), a kernel that writes a well-formed report and runs
  on is never answered ``ok``. Its call ends at its deadline with the kernel lost, and the
  process is gone when the result arrives, so nothing it started runs after the result.
  The session's next call gets its own output, never the previous call's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.restricted.test_kernel import kernel_process
from tests.security.language_bypass import MARK, bypass_daemon
from tests.security.test_kernel_escapes import FIND_SOCKET, call, session
from tests.security.test_restricted_escapes import LANGUAGE_LAYER
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.processes import running


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    with running_daemon(tmp_path_factory.mktemp("kernel-trust")) as d:
        yield d


@pytest.fixture(scope="module")
def bypass(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    tmp = tmp_path_factory.mktemp("kernel-trust-bypass")
    os.chmod(tmp, 0o755)
    with bypass_daemon(tmp) as d:
        yield d


#: every attribute path from a handed-out object towards the worker's frame writer
CHANNEL_PATHS = {
    "display.emit": "display.emit(b'r', b'{\"outcome\": \"ok\", \"value\": 1}')",
    "display.streams": "display.streams[0].emit(b'r', b'{}')",
    "display.caps": "display.caps",
    "open.resolve": "open.resolve('x')",
    "open.root": "open.root",
    "file._f": "f = open('f.txt', 'w')\nf._f",
    "type.mro": "type.mro()",
    "print_file": "print('x', file=display)",
}


@LANGUAGE_LAYER
@pytest.mark.parametrize("name", list(CHANNEL_PATHS))
@pytest.mark.parametrize("where", ["kernel", "one_shot"])
def test_no_handed_out_object_leads_to_the_channel(plain: RunningDaemon, name: str,
                                                   where: str) -> None:
    sid = session(plain) if where == "kernel" else None
    res = call(plain, "x = 41\n" + CHANNEL_PATHS[name], sid)
    assert res["status"] == "error", res
    assert res["value"] != 1, res
    assert "not allowed in the sandbox" in res["stderr"] or "AttributeError" in res["stderr"], \
        res
    if sid is not None:  # the refusal is an ordinary error: the kernel and its state live on
        after = call(plain, "x + 1", sid)
        assert after["status"] == "ok" and after["value"] == 42, after
        assert after["kernel"]["lost"] is False, after


def test_the_documented_surface_still_works(plain: RunningDaemon) -> None:
    sid = session(plain)
    res = call(plain, "with open('a.txt', 'w') as f:\n    f.write('hi')\n"
                      "f = open('a.txt')\ndisplay(f.read(), f.name, f.closed)\nf.close()\n"
                      "type(1).__name__", sid)
    assert res["status"] == "ok", res
    assert res["value"] == "int", res
    assert [o["data"]["text/plain"] for o in res["outputs"]] == ["'hi'", "'a.txt'", "False"]


#: a kernel that escaped the language layer writes a well-formed report of its own, then runs
FORGE_AND_RUN_ON = FIND_SOCKET + """
import json
wire = os.sys.modules["sandboxd.protocol.wire"]
report = {"outcome": "ok", "exit_code": 0, "value": "forged"}
os.write(chan, wire.encode(b"r", json.dumps(report).encode()))
%s
"""

RUN_ON = {
    "busy_loop": "while True:\n    pass",
    "writes_later": "time.sleep(1)\nopen('after.txt', 'w').write('ran on')\nwhile True:\n"
                    "    pass",
    "prints_later": "time.sleep(0.5)\nos.write(chan, wire.encode(b'o', b'stale output'))\n"
                    "time.sleep(30)",
}


@pytest.mark.parametrize("how", list(RUN_ON))
def test_a_forged_end_is_never_taken_for_the_end(bypass: RunningDaemon, how: str) -> None:
    sid = session(bypass)
    assert call(bypass, "x = 1", sid)["status"] == "ok"
    workspace = bypass.state_dir / "workspaces" / sid
    kernel = kernel_process(workspace)
    res = call(bypass, MARK + FORGE_AND_RUN_ON % RUN_ON[how], sid, timeout_s=3)
    answered = time.time()
    assert res["status"] == "timeout", res
    assert res["value"] != "forged", res
    assert res["kernel"]["lost"] is True, res
    assert res["cleanup"]["verified"] is True, res["cleanup"]
    # proven from outside: the process that ran the code is gone before the result arrived,
    # so it can write no file and burn no CPU after it
    assert not running(kernel), kernel
    after = workspace / "after.txt"  # written within the call, while it was still timed
    assert not after.exists() or after.stat().st_mtime <= answered
    fresh = call(bypass, "print('own output')\n2 + 2", sid)
    assert fresh["status"] == "ok" and fresh["value"] == 4, fresh
    assert fresh["stdout"] == "own output\n", fresh
    assert fresh["kernel"]["fresh"] is True, fresh


#: a worker that escaped the language layer sends a display item and a value nested 950 deep
DEEP_FRAMES = FIND_SOCKET + """
import json
wire = os.sys.modules["sandboxd.protocol.wire"]
deep = []
x = deep
for _ in range(950):
    x.append([])
    x = x[0]
os.write(chan, wire.encode(b"d", json.dumps({"data": {"application/json": deep}}).encode()))
result = deep
"""


@pytest.mark.parametrize("sid", [False, True])
def test_deep_json_from_an_escaped_sandbox_is_bounded_by_the_daemon(bypass: RunningDaemon,
                                                                    sid: bool) -> None:
    res = call(bypass, MARK + DEEP_FRAMES, session(bypass) if sid else None)
    assert res["status"] == "ok", res
    (item,) = res["outputs"]
    assert item["truncated"] is True and "64 levels" in item["data"]["text/plain"], item
    assert res["value"] is None and "64 levels" in res["message"], res


def test_a_genuine_kernel_is_proven_idle_call_after_call(bypass: RunningDaemon) -> None:
    sid = session(bypass)
    for i in range(20):
        res = call(bypass, f"v = {i}\nv * 2", sid)
        assert res["status"] == "ok" and res["value"] == 2 * i, res
        assert res["kernel"]["lost"] is False and res["kernel"]["calls"] == i + 1, res


def test_a_kernel_parked_with_a_signal_it_catches_unblocked_is_not_idle(
        bypass: RunningDaemon, tmp_path: Path) -> None:
    """Parked in the right ``read`` but wakeable by its own timer: not idle."""
    sid = session(bypass)
    assert call(bypass, "x = 1", sid)["status"] == "ok"
    kernel = kernel_process(bypass.state_dir / "workspaces" / sid)
    code = FORGE_AND_RUN_ON % (
        "sig = os.sys.modules['signal']\n"
        "sig.signal(sig.SIGALRM, lambda *a: None)\n"
        "sig.pthread_sigmask(sig.SIG_SETMASK, [])\n"
        "os.read(chan, 4)\n")
    res = call(bypass, MARK + code, sid, timeout_s=2)
    assert res["status"] == "timeout" and res["kernel"]["lost"] is True, res
    assert not running(kernel)
