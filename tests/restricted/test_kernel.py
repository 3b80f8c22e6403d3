"""Session kernels of the restricted backend, through the HTTP API of a real daemon:
Python state persists between the calls of one session and never crosses sessions or
clients; a timeout or a memory kill ends the kernel, says so, and the next call starts fresh
with the workspace files intact; deleting the session ends the kernel (process reaped,
cgroup removed); the zygote and another session's kernel are unaffected throughout."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from sandboxd.access.tokens import add_token
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.processes import running
from tests.support.scale import scaled
from tests.support.wait import wait_until


class Clients:
    def __init__(self, daemon: RunningDaemon, bob: httpx.Client) -> None:
        self.daemon = daemon
        self.alice = daemon.client
        self.bob = bob


@pytest.fixture(scope="module")
def clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clients]:
    tmp = tmp_path_factory.mktemp("kernels")
    os.chmod(tmp, 0o755)
    tokens = tmp / "tokens.yaml"
    alice = add_token(tokens, "alice")
    bob = add_token(tokens, "bob")
    with running_daemon(tmp, env={"SANDBOXD_TOKENS_FILE": str(tokens)}, token=alice) as d, \
            httpx.Client(base_url=d.url, headers={"Authorization": f"Bearer {bob}"},
                         timeout=120.0) as bob_client:
        yield Clients(d, bob_client)

#: code that ignores the interrupt a timeout sends first: its kernel is killed
IGNORES_INTERRUPT = ("while True:\n    try:\n        while True:\n            pass\n"
                     "    except KeyboardInterrupt:\n        pass")


def new_session(client: httpx.Client) -> str:
    resp = client.post("/v1/sessions", json={})
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def py(client: httpx.Client, code: str, session: str | None = None,
       **limits: object) -> dict:
    body: dict = {"arguments": {"code": code}, "limits": {"timeout_s": 20, **limits}}
    if session is not None:
        body["session"] = session
    resp = client.post("/v1/tools/python/invoke", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def kernel_process(workspace: Path) -> psutil.Process:
    """The live process working in ``workspace`` (chrooted into it when the daemon is root)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if Path(proc.cwd()) == workspace and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    assert len(found) == 1, f"expected one kernel process in {workspace}, found {found}"
    return found[0]


def cgroup_dirs(pid: int) -> list[Path]:
    """The cgroup directories of ``pid`` that belong to a sandbox worker (leaf ``w<hex>``)."""
    dirs = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _hier, controllers, path = line.split(":", 2)
        if not Path(path).name.startswith("w"):
            continue
        if controllers:
            base = Path("/sys/fs/cgroup") / controllers.split(",")[0].removeprefix("name=")
            if not base.exists():  # e.g. cpu,cpuacct mounted together
                base = Path("/sys/fs/cgroup") / controllers
        else:
            base = Path("/sys/fs/cgroup")
        dirs.append(base / path.lstrip("/"))
    return [d for d in dirs if d.exists()]


def wait_gone(pid: int, dirs: list[Path], what: str) -> None:
    """Wait until process ``pid`` has ended and its cgroup ``dirs`` are removed."""
    wait_until(lambda: not running(pid) and not any(d.exists() for d in dirs), timeout=15,
               what=f"{what} to be gone",
               detail=lambda: f"process alive={running(pid)}, "
                              f"cgroups {[d for d in dirs if d.exists()]}")


def test_state_persists_within_a_session(clients: Clients) -> None:
    sid = new_session(clients.alice)
    first = py(clients.alice, "x = 41", sid)
    assert first["status"] == "ok", first
    assert first["kernel"] == {"fresh": True, "calls": 1, "lost": False, "reason": None,
                            "interrupted": False}
    second = py(clients.alice, "x + 1", sid)
    assert second["value"] == 42, second
    assert second["kernel"] == {"fresh": False, "calls": 2, "lost": False, "reason": None,
                            "interrupted": False}
    py(clients.alice, "import math\n"
                      "def area(r):\n    return round(math.pi * r * r, 3)\n"
                      "class Counter:\n    def __init__(self):\n        self.n = 0\n"
                      "    def bump(self):\n        self.n += 1\n        return self.n\n"
                      "c = Counter()\n"
                      "f = open('notes.txt', 'w')\nf.write('a')", sid)
    res = py(clients.alice, "f.write('b')\nf.close()\n"
                            "[area(2), c.bump(), c.bump(), math.floor(2.5), "
                            "open('notes.txt').read()]", sid)
    assert res["status"] == "ok", res
    assert res["value"] == [12.566, 1, 2, 2, "ab"]
    # an exception does not end the kernel
    err = py(clients.alice, "1 / 0", sid)
    assert err["status"] == "error" and "ZeroDivisionError" in err["stderr"]
    assert err["kernel"]["lost"] is False
    assert py(clients.alice, "x", sid)["value"] == 41
    clients.alice.delete(f"/v1/sessions/{sid}")


def test_state_never_crosses_sessions_or_clients(clients: Clients) -> None:
    mine, other = new_session(clients.alice), new_session(clients.alice)
    bobs = new_session(clients.bob)
    assert py(clients.alice, "secret = 'alice-only'", mine)["status"] == "ok"
    for client, session in ((clients.alice, other), (clients.bob, bobs), (clients.alice, None)):
        res = py(client, "secret", session)
        assert res["status"] == "error" and "NameError" in res["stderr"], res
        assert "alice-only" not in str(res)
        if session is None:
            assert res["kernel"] is None  # one-shot calls have no kernel
        else:
            assert res["kernel"]["fresh"] is True
    # bob cannot run code in alice's session
    resp = clients.bob.post("/v1/tools/python/invoke",
                            json={"arguments": {"code": "secret"}, "session": mine})
    assert resp.status_code in (403, 404), resp.text
    assert "alice-only" not in resp.text
    assert py(clients.alice, "secret", mine)["value"] == "alice-only"
    for client, session in ((clients.alice, mine), (clients.alice, other), (clients.bob, bobs)):
        client.delete(f"/v1/sessions/{session}")


@pytest.mark.parametrize(
    ("code", "limits", "reason", "status"),
    [
        # code that ignores the interrupt it gets first: killed after the grace
        ("while True:\n    try:\n        while True:\n            pass\n"
         "    except KeyboardInterrupt:\n        pass", {"timeout_s": 1.5}, "wall_timeout",
         "timeout"),
        ("blocks = []\nwhile True:\n    blocks.append('a' * 10**6)", {}, "memory_limit",
         "killed"),
    ],
    ids=["timeout", "memory"],
)
def test_a_limit_ends_the_kernel_and_the_next_call_is_fresh(
        clients: Clients, code: str, limits: dict, reason: str, status: str) -> None:
    sid = new_session(clients.alice)
    workspace = clients.daemon.state_dir / "workspaces" / sid
    # the session's memory limit is its first call's
    assert py(clients.alice, "kept = 1\nopen('data.txt', 'w').write('intact')", sid,
              memory_bytes=64 * 1024 * 1024)["status"] == "ok"
    proc = kernel_process(workspace)
    dirs = cgroup_dirs(proc.pid)
    hit = py(clients.alice, code, sid, **limits)
    assert hit["status"] == status and hit["termination"]["reason"] == reason, hit
    assert hit["kernel"] == {"fresh": False, "calls": 2, "lost": True, "reason": reason,
                             "interrupted": False}
    assert hit["cleanup"]["verified"], hit["cleanup"]
    wait_gone(proc.pid, dirs, "the lost kernel")
    nxt = py(clients.alice, "open('data.txt').read()", sid)
    assert nxt["value"] == "intact", nxt
    assert nxt["kernel"] == {"fresh": True, "calls": 1, "lost": False, "reason": None,
                            "interrupted": False}
    gone = py(clients.alice, "kept", sid)
    assert gone["status"] == "error" and "NameError" in gone["stderr"], gone
    assert kernel_process(workspace).pid != proc.pid
    clients.alice.delete(f"/v1/sessions/{sid}")


def test_deleting_the_session_ends_its_kernel(clients: Clients) -> None:
    sid, bystander = new_session(clients.alice), new_session(clients.alice)
    py(clients.alice, "v = 'bystander'", bystander)
    assert py(clients.alice, "v = 1", sid)["status"] == "ok"
    proc = kernel_process(clients.daemon.state_dir / "workspaces" / sid)
    other = kernel_process(clients.daemon.state_dir / "workspaces" / bystander)
    zygote = proc.ppid()
    assert other.ppid() == zygote  # both forked from the zygote
    dirs = cgroup_dirs(proc.pid)
    if os.geteuid() == 0 and Path("/sys/fs/cgroup").is_dir():
        assert dirs, "a root daemon's kernel runs in a cgroup of its own"
    assert clients.alice.delete(f"/v1/sessions/{sid}").status_code == 204
    wait_gone(proc.pid, dirs, "the deleted session's kernel")
    # the zygote and the other session's kernel are unaffected
    assert psutil.Process(zygote).is_running()
    assert other.is_running()
    res = py(clients.alice, "v", bystander)
    assert res["value"] == "bystander" and res["kernel"]["fresh"] is False, res
    clients.alice.delete(f"/v1/sessions/{bystander}")
    wait_gone(other.pid, [], "the bystander's kernel")


def test_100_sessions_leave_no_kernel_cgroup_or_descriptor(clients: Clients) -> None:
    """100 sessions created, used (a kernel each, some lost to a timeout) and deleted: no
    kernel process, no kernel cgroup, no descriptor of the daemon left behind."""
    daemon = psutil.Process(clients.daemon.proc.pid)
    workspaces = clients.daemon.state_dir / "workspaces"
    sid = new_session(clients.alice)  # warm: the daemon's own descriptors are all open
    py(clients.alice, "1", sid)
    clients.alice.delete(f"/v1/sessions/{sid}")
    fds_before = daemon.num_fds()
    seen: list[tuple[int, list[Path]]] = []
    for i in range(scaled(100)):  # fewer under emulation (tests/support/scale.py)
        sid = new_session(clients.alice)
        res = py(clients.alice, "x = 1", sid)
        assert res["kernel"]["fresh"], res
        if i % 25 == 0:  # a few lose their kernel first
            lost = py(clients.alice, IGNORES_INTERRUPT, sid, timeout_s=0.5)
            assert lost["kernel"]["lost"], lost
            py(clients.alice, "x = 2", sid)
        if i % 10 == 0:
            proc = kernel_process(workspaces / sid)
            seen.append((proc.pid, cgroup_dirs(proc.pid)))
        assert clients.alice.delete(f"/v1/sessions/{sid}").status_code == 204
    for pid, dirs in seen:
        wait_gone(pid, dirs, "a deleted session's kernel")
    def kernels() -> list[int]:
        found = []
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error):
                if Path(proc.cwd()).is_relative_to(workspaces):
                    found.append(proc.pid)
        return found

    wait_until(lambda: not kernels() and daemon.num_fds() <= fds_before + 4, timeout=15,
               interval=0.1, what="no kernel left behind and the daemon's descriptors back",
               detail=lambda: f"kernels {kernels()}, fds {fds_before} -> {daemon.num_fds()}")
