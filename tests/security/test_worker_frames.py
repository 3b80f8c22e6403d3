"""A restricted worker whose language layer was bypassed writes whatever it likes on its result
socket. Through a real daemon (its zygote patched by ``bypass/sitecustomize.py`` to run code
marked ``#unrestricted`` with plain ``exec`` inside the fully confined worker): floods of
unknown frames, oversized frames and malformed reports must fail that call only - status
``error``, the worker killed and its cleanup verified - while ``/healthz`` keeps answering and
the next call works."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.ci import require
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.wait import wait_until

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = pytest.mark.same_on_every_host(
    "what a bypassed worker writes on its result socket is read by the daemon's own frame "
    "parser; the worker's confinement itself is proven in the VM by test_restricted_escapes")

BYPASS = Path(__file__).with_name("bypass")

FLOOD_UNKNOWN = """#unrestricted
blob = (b"Z" + bytes(8)) * 8192   # unknown kind (old and new header layouts alike)
while True:
    os.write(fd, blob)
"""

OVERSIZED = """#unrestricted
os.write(fd, struct.pack(">cII", b"o", 0, 0x7FFFFFFF))
while True:
    os.write(fd, b"x" * 65536)
    time.sleep(0.001)
"""

REPORTS = {
    "exit_code_not_int": b'{"outcome": "ok", "exit_code": "zz"}',
    "message_not_str": b'{"outcome": "error", "exit_code": 1, "message": ["x", {"y": 1}]}',
    "not_an_object": b'[1, 2, 3]',
    "unknown_outcome": b'{"outcome": "pwned", "exit_code": 0}',
    "deep_nesting": b"[" * 200_000,
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    require(os.geteuid() == 0, "root (workers confined as in production: chroot, uid, cgroups)")
    tmp = tmp_path_factory.mktemp("frames")
    os.chmod(tmp, 0o755)
    env = {"PYTHONPATH": str(BYPASS), "SANDBOXD_CONTAINER_ENABLED": "false"}
    with running_daemon(tmp, env=env) as d:
        yield d


def _python(d: RunningDaemon, code: str, timeout_s: float = 8) -> dict:
    r = d.invoke("python", {"code": code}, limits={"timeout_s": timeout_s})
    assert r.status_code == 200, r.text
    return r.json()


def _assert_failed_cleanly(res: dict, *words: str) -> None:
    assert res["status"] == "error", res
    assert "protocol" in (res["message"] or ""), res
    for word in words:
        assert word in res["message"], res
    assert res["cleanup"]["verified"], res


def _assert_next_call_works(d: RunningDaemon) -> None:
    res = _python(d, "print(6 * 7)")
    assert (res["status"], res["stdout"]) == ("ok", "42\n"), res


def test_bypass_harness_is_active(daemon: RunningDaemon) -> None:
    """The harness really runs unrestricted code in the confined worker (else the tests
    below prove nothing): ``os`` is out of reach of normal code."""
    res = _python(daemon, "#unrestricted\nos.write(fd, b'')\n")
    assert res["status"] == "ok", res


def test_flood_of_unknown_frames_fails_the_call_only(daemon: RunningDaemon) -> None:
    worst = [0.0]
    polls = [0]
    stop = threading.Event()

    def poll_healthz() -> None:
        with httpx.Client(base_url=daemon.url, timeout=30) as c:
            while not stop.is_set():
                t0 = time.monotonic()
                assert c.get("/healthz").status_code == 200
                worst[0] = max(worst[0], time.monotonic() - t0)
                polls[0] += 1
                time.sleep(0.02)  # sleep-ok: the sampling period of a monitor, not a wait

    poller = threading.Thread(target=poll_healthz)
    poller.start()
    try:
        res = _python(daemon, FLOOD_UNKNOWN)
        # a few more answers while the daemon cleans up after the flood
        after = polls[0]
        wait_until(lambda: polls[0] >= after + 5 or not poller.is_alive(), timeout=30,
                   what="5 more /healthz answers after the flood")
    finally:
        stop.set()
        poller.join(60)
    _assert_failed_cleanly(res, "unknown frame kind")
    # a bounded-wait liveness check, not a benchmark: the old daemon stalled for seconds
    assert worst[0] < 1.5, f"/healthz stalled {worst[0]:.2f} s during the flood"
    _assert_next_call_works(daemon)


def test_oversized_frame_is_refused_at_its_header(daemon: RunningDaemon) -> None:
    res = _python(daemon, OVERSIZED)
    _assert_failed_cleanly(res, "2147483647 bytes")
    _assert_next_call_works(daemon)


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_malformed_report_fails_the_call_only(daemon: RunningDaemon, name: str) -> None:
    code = (
        "#unrestricted\n"
        f"emit(b'o', b'partial output')\nemit(b'r', {REPORTS[name]!r})\n"
        "time.sleep(30)\n"
    )
    res = _python(daemon, code)
    _assert_failed_cleanly(res, "report")
    _assert_next_call_works(daemon)


def test_frame_after_the_report_fails_the_call(daemon: RunningDaemon) -> None:
    code = (
        "#unrestricted\n"
        "emit(b'r', b'{\"outcome\": \"ok\", \"exit_code\": 0}')\n"
        "emit(b'o', b'forged output after the report')\n"
        "time.sleep(30)\n"
    )
    res = _python(daemon, code)
    _assert_failed_cleanly(res, "after the final report")
    assert "forged" not in res["stdout"]
    _assert_next_call_works(daemon)


DISPLAY_ITEMS = {
    "unknown_mime": b'{"data": {"application/x-sh": "rm -rf /"}}',
    "png_that_is_not": b'{"data": {"image/png": "PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg=="}}',
    "not_base64": b'{"data": {"image/png": "%%%"}}',
    "lying_cut_record": b'{"cut": {"mime": "text/plain", "bytes": -5}}',
    "deep_nesting": b'{"data": {"application/json": ' + b"[" * 100_000 + b"}}",
}


@pytest.mark.parametrize("name", sorted(DISPLAY_ITEMS))
def test_a_forged_display_item_fails_the_call_only(daemon: RunningDaemon, name: str) -> None:
    code = (
        "#unrestricted\n"
        f"emit(b'd', {DISPLAY_ITEMS[name]!r})\n"
        "emit(b'r', b'{\"outcome\": \"ok\", \"exit_code\": 0}')\n"
        "time.sleep(30)\n"
    )
    res = _python(daemon, code)
    _assert_failed_cleanly(res, "display item")
    assert res["outputs"] == []  # nothing forged reaches the caller
    _assert_next_call_works(daemon)


def test_an_oversized_display_frame_is_refused_at_its_header(daemon: RunningDaemon) -> None:
    code = ("#unrestricted\n"
            "os.write(fd, struct.pack('>cII', b'd', 0, 64 * 1024 * 1024))\n"
            "time.sleep(30)\n")
    res = _python(daemon, code)
    _assert_failed_cleanly(res, str(64 * 1024 * 1024))
    _assert_next_call_works(daemon)


def test_a_display_flood_past_the_count_is_bounded(daemon: RunningDaemon) -> None:
    code = ("#unrestricted\n"
            "for i in range(5000):\n"
            "    emit(b'd', b'{\"data\": {\"text/plain\": \"spam\"}}')\n"
            "emit(b'r', b'{\"outcome\": \"ok\", \"exit_code\": 0}')\n")
    res = _python(daemon, code)
    # the frame budget ends it, or the daemon keeps the cap: never 5000 items
    assert len(res["outputs"]) <= 33, len(res["outputs"])
    if res["status"] == "ok":
        assert res["outputs"][-1]["truncated"] is True
    else:
        _assert_failed_cleanly(res)
    _assert_next_call_works(daemon)
