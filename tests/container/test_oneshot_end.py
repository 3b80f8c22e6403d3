"""A one-shot container call ends as soon as the kernel proves its processes gone (its init's
pidfd: sandboxd/backends/container/reaper.py), not when the engine has removed the container
(issue 25): nothing it started outlives the result, and the engine's removal follows."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends.container.backend import ContainerBackend
from sandboxd.backends.container.reaper import open_init
from sandboxd.models import Status
from tests.container.conftest import labelled, make_settings, run, workspace
from tests.support.wait import wait_until

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
