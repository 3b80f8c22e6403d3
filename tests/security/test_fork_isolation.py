"""Forks of a session are sandboxes of their own at the process layer: from a fork, with the
language layer assumed broken (:mod:`tests.security.language_bypass`), its parent's and its
sibling's running processes cannot be signalled, traced, re-limited or read (``kill``,
``ptrace``, ``process_vm_readv``, ``prlimit64``, ``/proc/<pid>/root``, ``cwd``, ``mem``,
``environ``), and their files cannot be reached (each runs as its own uid in its own root).
The cross-session attack of tests/security/test_isolation.py, run against forks."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from tests.security.language_bypass import bypass_daemon
from tests.security.test_isolation import ATTACKER, VICTIM, _process_in, _requirements, run
from tests.support.daemon import RunningDaemon

#: beyond ATTACKER's calls: trace, read memory, reach files through /proc and the host path
REACH = """
libc = ctypes.CDLL(None, use_errno=True)
T = %(target)d

def attempt(fn):
    ctypes.set_errno(0)
    res = fn()
    return 0 if res >= 0 else ctypes.get_errno()

class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

buf = ctypes.create_string_buffer(64)
local = IoVec(ctypes.cast(buf, ctypes.c_void_p), 64)
remote = IoVec(0x400000, 64)
out = {"uid": os.getuid()}
out["ptrace_attach"] = attempt(lambda: libc.ptrace(16, T, None, None))
out["ptrace_seize"] = attempt(lambda: libc.ptrace(0x4206, T, None, None))
out["process_vm_readv"] = attempt(lambda: libc.process_vm_readv(
    T, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0))
out["kill_term"] = attempt(lambda: libc.kill(T, 15))
for name, path in (("proc_root", "/proc/%%d/root/secret.txt" %% T),
                   ("proc_cwd", "/proc/%%d/cwd/secret.txt" %% T),
                   ("proc_mem", "/proc/%%d/mem" %% T),
                   ("proc_environ", "/proc/%%d/environ" %% T),
                   ("host_path", %(host)r)):
    try:
        with open(path, "rb") as f:
            f.read(1)
        out[name] = 0
    except OSError as exc:
        out[name] = exc.errno or -1
result = out
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    tmp = tmp_path_factory.mktemp("fork-isolation")
    os.chmod(tmp, 0o755)
    with bypass_daemon(tmp, env={"SANDBOXD_CONTAINER_ENABLED": "false"}) as d:
        yield d


def _attack(daemon: RunningDaemon, victim_sid: str, attacker_sid: str) -> None:
    workspace = daemon.state_dir / "workspaces" / victim_sid
    victim: dict = {}
    thread = threading.Thread(
        target=lambda: victim.update(run(daemon, VICTIM, session=victim_sid)), daemon=True)
    thread.start()
    try:
        while not (workspace / "started").exists():
            assert thread.is_alive(), victim
            threading.Event().wait(0.01)
        target = _process_in(workspace)
        limits = run(daemon, ATTACKER % {"target": target}, session=attacker_sid)
        reach = run(daemon, REACH % {"target": target,
                                     "host": str(workspace / "secret.txt")},
                    session=attacker_sid)
    finally:
        (workspace / "go").write_text("go")
        thread.join(120)
    for answer in (limits, reach):
        assert answer["status"] == "ok", answer
        out = answer["value"]
        touched = {k: v for k, v in out.items()
                   if k != "uid" and not k.startswith("own_") and v == 0}
        assert not touched, f"a fork reached pid {target} of another sandbox: {touched}"
    assert victim["status"] == "ok", victim
    mine = victim["value"]
    assert mine["cpu_after"] == mine["cpu"] and mine["nice_after"] == mine["nice"], mine
    assert mine["uid"] != limits["value"]["uid"], "a fork ran as its victim's uid"


def test_a_fork_cannot_touch_its_parent_or_its_sibling(daemon: RunningDaemon) -> None:
    _requirements()
    parent = daemon.client.post("/v1/sessions", json={}).json()["id"]
    wrote = daemon.invoke("write_file", {"path": "secret.txt", "content": "parent's"},
                          session=parent).json()
    assert wrote["status"] == "ok", wrote
    r = daemon.client.post(f"/v1/sessions/{parent}/fork", json={"count": 2})
    assert r.status_code == 201, r.text
    one, two = (s["id"] for s in r.json()["sessions"])
    _attack(daemon, parent, one)  # a fork against its parent
    _attack(daemon, two, one)  # ... against its sibling
    _attack(daemon, one, parent)  # and the parent against its fork
    # every fork still has its own copy (a fork's file is not its parent's file)
    for sid in (one, two):
        seen = run(daemon, "result = open('secret.txt').read()", session=sid)
        assert seen["value"] == "parent's", seen
