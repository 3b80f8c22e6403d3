"""A one-shot container call ends as soon as the kernel proves its processes gone (its init's
pidfd: sandboxd/backends/container/reaper.py), not when the engine has removed the container
(a removal's wait is no part of the call's time): nothing it started outlives the result, and the
engine's removal follows."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends.container.backend import ContainerBackend
from sandboxd.backends.container.reaper import InitHandle, kill_and_prove, open_init
from sandboxd.models import Status
from tests.container.conftest import labelled, make_settings, run, workspace
from tests.support.wait import async_wait_until, wait_until

pytestmark = [pytest.mark.docker]


def processes_with(needle: str) -> list[int]:
    """Host pids whose command line holds ``needle`` (any pid namespace: all are below ours)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if needle.encode() in f.read():
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


async def test_nothing_a_one_shot_call_started_outlives_its_result(
        backend: ContainerBackend, tmp_path: Path, docker_client: Any) -> None:
    seconds = str(900_000 + secrets.randbelow(99_999))  # this call's own sleeper
    ws = workspace(tmp_path, "bg")
    res = await run(backend, ws, argv=["sh", "-c", f"sleep {seconds} & sleep {seconds} & "
                                       "echo started"], timeout=20)
    left = processes_with(f"sleep\0{seconds}")  # read before anything else runs
    assert res.status is Status.ok and res.stdout == "started\n", res
    assert left == [], f"processes of the call outlived its result: {left}"
    assert res.cleanup.verified, res.cleanup
    # the kernel's proof, not the engine's removal, ended it; the removal follows
    assert "PID namespace is empty" in res.cleanup.detail, res.cleanup
    name = res.cleanup.detail.split("container ")[1].split()[0]
    wait_until(lambda: name not in {c.name for c in labelled(docker_client,
                                                              backend.config.instance_name)},
               timeout=30, what="the engine to remove the call's container")


async def test_closing_the_backend_waits_for_the_removals(tmp_path: Path,
                                                          docker_client: Any) -> None:
    b = ContainerBackend.from_settings(make_settings(tmp_path, warm_pool_size=1))
    await b.start()
    try:
        results = [await run(b, workspace(tmp_path, f"w{i}"), argv=["true"]) for i in range(3)]
        assert all(r.status is Status.ok and r.cleanup.verified for r in results), results
    finally:
        await b.close()
    assert not b.boxes.removals
    assert labelled(docker_client, b.config.instance_name) == []


def test_a_pid_that_is_not_the_container_s_init_gets_no_handle() -> None:
    cid = secrets.token_hex(32)  # no cgroup names it
    assert open_init(os.getpid(), cid) is None  # a live process, another cgroup
    assert open_init(0, cid) is None
    assert open_init(2 ** 22 + 1, cid) is None  # above pid_max: no such process
    assert open_init(os.getpid(), "short") is None


#: a PID namespace's init (python) with a child that holds much memory (its exit takes a while:
#: its pages are freed) and says so by a file
BIG_CHILD = """\
import os, sys, time
if os.fork() == 0:
    held = b"x" * (512 << 20)
    open(sys.argv[1], "w").close()
    time.sleep(1000)
time.sleep(1000)
"""


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


async def test_the_proof_waits_for_every_process_of_the_namespace(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "--", sys.executable, "-c",
                              BIG_CHILD, str(ready)])
    try:
        await async_wait_until(ready.exists, timeout=60, what="the big child's memory held")
        (init,) = children(outer.pid)
        (big,) = children(init)
        handle = InitHandle(init, os.pidfd_open(init))
        try:
            assert await kill_and_prove(handle, 30)
        finally:
            handle.close()
        # the init's exit completed only once the child's had: nothing of it is left
        assert not os.path.exists(f"/proc/{big}"), "the proof came before the child was gone"
    finally:
        outer.kill()
        outer.wait(timeout=30)
