"""Sandboxes are isolated from each other at the process layer (no sandbox
may see, signal or trace another's processes).

Through a real daemon whose workers run unrestricted Python for ``#bypass`` code (see
:mod:`tests.security.language_bypass`: the language layer is assumed broken):

* two concurrent sandboxes run as different uids, and from one, ``prlimit64``,
  ``setpriority``, ``sched_setaffinity``, ``sched_setscheduler``, ``ioprio_set`` and ``kill``
  against the other's pid all fail, while the other completes normally with its limits intact;
* a SysV shared-memory segment made by one call is invisible to a later call, and no segment
  is left on the host after the calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.security.language_bypass import MARK, bypass_daemon
from tests.support.ci import require
from tests.support.daemon import RunningDaemon


def _requirements() -> None:
    require(os.geteuid() == 0, "root (per-sandbox uids and namespaces are the root mode)")
    require(platform.machine() == "x86_64", "x86_64 (the attack uses raw syscall numbers)")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    tmp = tmp_path_factory.mktemp("isolation")
    os.chmod(tmp, 0o755)
    with bypass_daemon(tmp) as d:
        yield d


def run(daemon: RunningDaemon, code: str, **body: object) -> dict:
    resp = daemon.invoke("python", {"code": MARK + code}, limits={"timeout_s": 60}, **body)
    assert resp.status_code == 200, resp.text
    return resp.json()


VICTIM = """
me = {"uid": os.getuid(), "cpu": list(resource.getrlimit(resource.RLIMIT_CPU)),
      "nice": os.getpriority(os.PRIO_PROCESS, 0)}
with open("started", "w") as f:
    f.write("1")
while not os.path.exists("go"):
    time.sleep(0.005)
me["cpu_after"] = list(resource.getrlimit(resource.RLIMIT_CPU))
me["nice_after"] = os.getpriority(os.PRIO_PROCESS, 0)
result = me
"""

ATTACKER = """
libc = ctypes.CDLL(None, use_errno=True)
T = %(target)d

def attempt(fn):
    ctypes.set_errno(0)
    res = fn()
    return 0 if res >= 0 else ctypes.get_errno()

class RLimit(ctypes.Structure):
    _fields_ = [("cur", ctypes.c_ulong), ("max", ctypes.c_ulong)]

one, old = RLimit(1, 1), RLimit(0, 0)
mask, prio = ctypes.c_ulong(1), ctypes.c_int(0)
out = {"uid": os.getuid()}
out["prlimit64_cpu"] = attempt(lambda: libc.prlimit(T, 0, ctypes.byref(one), None))
out["prlimit64_read"] = attempt(lambda: libc.prlimit(T, 0, None, ctypes.byref(old)))
out["setpriority"] = attempt(lambda: libc.setpriority(0, T, 19))
out["setpriority_user"] = attempt(lambda: libc.setpriority(2, os.getuid(), 19))
out["sched_setaffinity"] = attempt(lambda: libc.sched_setaffinity(T, 8, ctypes.byref(mask)))
out["sched_setscheduler"] = attempt(lambda: libc.sched_setscheduler(T, 5, ctypes.byref(prio)))
out["sched_setparam"] = attempt(lambda: libc.sched_setparam(T, ctypes.byref(prio)))
out["ioprio_set"] = attempt(lambda: libc.syscall(251, 1, T, (3 << 13) | 7))
out["kill"] = attempt(lambda: libc.kill(T, 0))
out["own_prlimit_read"] = attempt(lambda: libc.prlimit(0, 0, None, ctypes.byref(old)))
out["own_setpriority"] = attempt(lambda: libc.setpriority(0, 0, 5))
result = out
"""


def _process_in(workspace: Path) -> int:
    """The host pid of the (chrooted) process whose working directory is ``workspace``."""
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if Path(proc.cwd()) == workspace:
                return proc.pid
    raise AssertionError(f"no process works in {workspace}")


def test_concurrent_sandboxes_cannot_touch_each_other(daemon: RunningDaemon) -> None:
    _requirements()
    resp = daemon.client.post("/v1/sessions", json={})
    assert resp.status_code == 201, resp.text
    sid = resp.json()["id"]
    workspace = daemon.state_dir / "workspaces" / sid
    victim: dict = {}
    thread = threading.Thread(
        target=lambda: victim.update(run(daemon, VICTIM, session=sid)), daemon=True
    )
    thread.start()
    try:
        while not (workspace / "started").exists():
            assert thread.is_alive(), victim
            threading.Event().wait(0.01)
        target = _process_in(workspace)
        attacker = run(daemon, ATTACKER % {"target": target})
    finally:
        (workspace / "go").write_text("go")
        thread.join(120)
    assert attacker["status"] == "ok", attacker
    out = attacker["value"]
    touched = {k: v for k, v in out.items() if k not in ("uid",) and not k.startswith("own_")
               and v == 0}
    assert not touched, f"calls against another sandbox's pid {target} succeeded: {touched}"
    assert out["own_prlimit_read"] == 0 and out["own_setpriority"] == 0, out

    assert victim["status"] == "ok", victim
    mine = victim["value"]
    assert mine["cpu_after"] == mine["cpu"] and mine["nice_after"] == mine["nice"], mine
    assert mine["uid"] != out["uid"], "two concurrent sandboxes ran as the same uid"
    assert victim["cleanup"]["verified"] and attacker["cleanup"]["verified"]


SHM_CREATE = """
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
sid = libc.shmget(%(key)d, 1 << 20, 0o1666)
if sid < 0:
    result = ["refused", ctypes.get_errno()]
else:
    addr = libc.shmat(sid, None, 0)
    ctypes.memmove(addr, %(secret)r, %(n)d)
    result = ["created", sid]
"""

SHM_READ = """
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
sid = libc.shmget(%(key)d, 0, 0)
if sid < 0:
    result = ["absent", ctypes.get_errno()]
else:
    addr = libc.shmat(sid, None, 0)
    result = ["seen", ctypes.string_at(addr, %(n)d).decode("latin-1")]
"""


def _host_segments() -> dict[int, int]:
    """key -> shmid of every SysV shared-memory segment of the host's IPC namespace."""
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    return {int(f[0]): int(f[1]) for f in (line.split() for line in lines)}


def test_sysv_shared_memory_is_private_and_gone_after_the_call(daemon: RunningDaemon) -> None:
    _requirements()
    key = 0x5B000000 + secrets.randbelow(1 << 20)
    secret = "shm-secret-" + secrets.token_hex(8)
    fields = {"key": key, "secret": secret.encode(), "n": len(secret)}
    before = _host_segments()
    try:
        made = run(daemon, SHM_CREATE % fields)
        seen = run(daemon, SHM_READ % fields)
        after = _host_segments()
    finally:
        libc = ctypes.CDLL(None, use_errno=True)
        for k, shmid in _host_segments().items():
            if k == key:
                libc.shmctl(shmid, 0, None)  # IPC_RMID: leave nothing behind, whatever happened
    assert made["status"] == "ok" and seen["status"] == "ok", (made, seen)
    assert secret not in json.dumps(seen), "a later call read another call's shared memory"
    assert seen["value"][0] == "absent", seen
    assert key not in after and set(after) <= set(before), "a segment outlived its call"
    assert made["cleanup"]["verified"] and seen["cleanup"]["verified"]
