"""The daemon's fixed cost (what it holds while idle): every module ``sandboxd serve`` imports is
memory the daemon keeps for its lifetime, and so is every process it keeps. These tests pin what the
serve path leaves out: the other command groups, the restricted worker's stack (RestrictedPython,
the language layer: only the zygote's workers need it), psutil (two /proc reads), the Docker
SDK with requests and urllib3 (the container backend speaks the engine's API itself:
``sandboxd/backends/container/dockerapi.py``) and a heavy mount helper."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemon import RunningDaemon
from tests.support.imports import loaded

SERVE_PATH = """
import contextlib, io, json, sys, tempfile
import sandboxd.cli
sys.argv = ["sandboxd", "serve", "--help"]  # the command line `sandboxd serve` takes
with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
    sandboxd.cli.main()
from sandboxd.api.app import create_app
from sandboxd.config import Settings
from sandboxd.backends import registry
import sandboxd.backends.restricted.backend, sandboxd.backends.restricted.kernel
import sandboxd.backends.restricted.probe
with tempfile.TemporaryDirectory() as state:
    create_app(Settings(state_dir=state))
assert registry.get("restricted").offered_modules()
import sandboxd.backends.container.backend, sandboxd.backends.restricted.outcome
HEAVY = {"RestrictedPython", "psutil", "docker", "requests", "urllib3"}
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in HEAVY
      or m.startswith("sandboxd.backends.restricted.lang")
      or m == "sandboxd.backends.restricted.worker"
      or m.startswith("sandboxd.cli.") and m not in {"sandboxd.cli.daemon"})))
"""


def test_serve_loads_neither_other_commands_nor_the_workers_stack() -> None:
    assert loaded(SERVE_PATH) == []


def test_the_restricted_module_list_is_the_workers_table() -> None:
    """The daemon's policy checks read the name list; the worker's table must offer exactly
    those modules (its import refuses to load otherwise)."""
    from sandboxd.backends.restricted.lang.module_allowlist import MODULES
    from sandboxd.backends.restricted.offered import OFFERED_MODULES

    assert set(MODULES) == OFFERED_MODULES


@pytest.mark.parametrize("module", ["sandboxd.backends.restricted.worker", "sandboxd.cli.audit",
                                    "docker"])
def test_the_guard_sees_a_heavy_import(module: str) -> None:
    """The check above can fail."""
    assert module in loaded(SERVE_PATH.replace("import sandboxd.cli\n",
                                               f"import sandboxd.cli, {module}\n"))


def test_the_mount_helper_is_an_isolated_interpreter_that_serves(tmp_path: Path) -> None:
    """The helper runs ``python -I -S`` (no site-packages, no environment) and still answers:
    a request for a name outside the workspaces is refused by it."""
    from sandboxd.workspaces.quota import MountHelper

    helper = MountHelper(tmp_path)
    try:
        assert helper.proc.args[1:3] == ["-I", "-S"]
        with pytest.raises(OSError) as exc:
            helper.request(op="create", name="../escape", size=1 << 20, inodes=16, uid=None)
        assert exc.value.errno == errno.EINVAL
        assert helper.alive()
    finally:
        helper.close()


def test_the_mount_helper_loads_neither_json_nor_socket_nor_enum(tmp_path: Path) -> None:
    """``json``, ``socket`` and ``signal`` pull in ``enum`` and ``re``: 1.4 of the helper's
    4.6 MiB. The helper's own command line, its peer gone at once (it returns), then a look at
    what it imported."""
    import socket

    from sandboxd.workspaces.mount_helper import helper_argv

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.close()
    root = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    argv = helper_argv(str(Path(__file__).resolve().parents[2]), [theirs.fileno()], root)
    argv[4] += "; print(' '.join(sorted(sys.modules)))"
    try:
        out = subprocess.run(argv, capture_output=True, text=True, check=True,
                             pass_fds=(theirs.fileno(), root)).stdout.split()
    finally:
        theirs.close()
        os.close(root)
    assert "sandboxd.workspaces.mount_helper" in out and "_signal" in out
    assert not {"json", "socket", "signal", "enum", "re"} & set(out)


def test_the_mount_helper_wire_format_refuses_what_it_cannot_carry() -> None:
    from sandboxd.workspaces.mount_helper import (
        decode_reply,
        decode_request,
        encode_reply,
        encode_request,
    )

    raw = encode_request({"op": "mount", "name": "ws", "size": 5, "uid": None})
    assert decode_request(raw) == {"op": "mount", "name": "ws", "size": "5", "uid": ""}
    for bad in ({"name": 5.0}, {"name": b"ws"}, {"name": "a\0b"}, {"name": "é"}):
        with pytest.raises(OSError) as exc:
            encode_request(bad)
        assert exc.value.errno == errno.EINVAL
    for raw in (b"name=a\0name=b", b"=x", b"\xff"):
        with pytest.raises(ValueError):
            decode_request(raw)
    assert decode_reply(encode_reply()) == (0, "")
    assert decode_reply(encode_reply(errno.EBUSY, "busy")) == (errno.EBUSY, "busy")
    assert decode_reply(b"garbage")[0] == errno.EIO


def test_procinfo_tells_a_live_child_from_a_zombie_and_a_reaped_one() -> None:
    """What :func:`outcome.verify_gone` reads in place of psutil, on real processes."""
    from sandboxd.backends.restricted.outcome import verify_gone
    from sandboxd.host import procinfo

    r, w = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", "import os, sys; os.read(int(sys.argv[1]), 1)",
                              str(r)], pass_fds=(r,))
    os.close(r)
    try:
        ppid, state = procinfo.parent_and_state(child.pid) or (0, "")
        assert ppid == os.getpid() and state in "RSD"
        assert verify_gone(child.pid, None, {}, os.getpid())[1] == (
            f"no exit report from the zygote; worker {child.pid} still running")
        os.close(w)
        wait_zombie(child.pid)
        assert procinfo.parent_and_state(child.pid) == (os.getpid(), "Z")
        assert verify_gone(child.pid, None, {}, os.getpid())[1] == (
            f"no exit report from the zygote; worker {child.pid} not reaped")
    finally:
        child.wait()
    assert procinfo.parent_and_state(child.pid) is None
    assert verify_gone(child.pid, None, {"cgroup_empty": True}, os.getpid()) == (True, None)
    assert procinfo.mem_available() > 0


def wait_zombie(pid: int) -> None:
    from sandboxd.host import procinfo
    from tests.support.wait import wait_until

    wait_until(lambda: (procinfo.parent_and_state(pid) or (0, ""))[1] == "Z", timeout=30,
               what="the child's exit")


def test_a_daemon_that_ran_a_call_has_not_loaded_psutil(daemon: RunningDaemon) -> None:
    """The real daemon, after a restricted call (its worker proved gone): psutil's C extension
    is not in its memory map."""
    res = daemon.invoke("python", {"code": "print(1)"})
    assert res.status_code == 200 and res.json()["cleanup"]["verified"], res.text
    maps = Path(f"/proc/{daemon.proc.pid}/maps").read_text()
    assert "_pydantic_core" in maps  # the map is the daemon's
    assert "_psutil_linux" not in maps


def test_a_ready_daemon_has_trimmed_its_c_heap(tmp_path: Path) -> None:
    """Start-up's freed C heap goes back to the kernel once the daemon is ready (glibc's
    ``malloc_trim``, 0.8 MiB of an idle daemon): the real daemon says so at debug level."""
    from sandboxd.host import heap
    from tests.support.daemon import running_daemon

    assert heap.trim() in (True, False)  # callable here as in the daemon
    with running_daemon(tmp_path, args=("--log-level", "debug")) as daemon:
        log = daemon.log()
    assert "sandboxd ready on" in log
    assert "malloc_trim after start-up" in log
