"""The runners' sockets live below the state directory, however long its path: a daemon
that is killed leaves nothing in ``/tmp`` (the next start on its state directory sweeps
``<state>/run``). Before, a state path past a unix socket's 108 bytes moved them to a
``/tmp/sandboxd-run-*`` directory that nothing removed after a ``kill -9``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends.container import ContainerBackend
from sandboxd.backends.container.runner import SUN_PATH_MAX
from tests.container.conftest import labelled, make_settings, run, workspace

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.same_on_every_host(
    "where the runners' sockets live and the sweep of a killed backend's run directory: "
    "paths and files, the same on any host")]


async def test_a_long_state_path_keeps_the_runner_sockets_below_it(
        docker_client: Any, tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    b = ContainerBackend.from_settings(make_settings(deep, warm_pool_size=0))
    await b.start()
    try:
        ok, why = b.availability()
        assert ok, why
        rundir = b.boxes.rundir
        assert rundir == deep / "state" / "run"
        assert len(str(rundir / ("x" * 16) / "runner.sock")) > SUN_PATH_MAX
        result = await run(b, workspace(tmp_path), argv=["echo", "connected"])
        assert result.status.value == "ok", result
        assert result.stdout == "connected\n"
    finally:
        await b.close()
    assert labelled(docker_client, b.config.instance_name) == []
    assert not rundir.exists()


async def test_the_next_start_sweeps_what_a_killed_backend_left(
        docker_client: Any, tmp_path: Path) -> None:
    deep = tmp_path / ("k" * 60) / ("l" * 60)
    leftover = deep / "state" / "run" / "0123456789abcdef"
    leftover.mkdir(parents=True)
    (leftover / "runner.sock").write_bytes(b"")  # a killed daemon's endpoint
    b = ContainerBackend.from_settings(make_settings(deep, warm_pool_size=0))
    await b.start()
    try:
        assert not leftover.exists()
        assert b.boxes.rundir == deep / "state" / "run"
    finally:
        await b.close()


async def test_a_container_sees_no_host_path_of_its_runner_socket(
        docker_client: Any, tmp_path: Path) -> None:
    """The runner's channel is a connection accepted on the daemon's socket, and the kernel
    lists it with that socket's bound address in the *container's* ``/proc/net/unix``: the
    address names no host path (the state directory), only the daemon's descriptor."""
    b = ContainerBackend.from_settings(make_settings(tmp_path, warm_pool_size=0))
    await b.start()
    try:
        ok, why = b.availability()
        assert ok, why
        state = str(b.config.state_dir)
        ws = workspace(tmp_path)
        for call in ({"argv": ["cat", "/proc/net/unix"]},
                     {"code": "print(open('/proc/net/unix').read())"}):
            for session in (None, "s1"):
                result = await run(b, ws, session=session, **call)  # type: ignore[arg-type]
                assert result.status.value == "ok", result
                paths = [ln.split()[7] for ln in result.stdout.splitlines()[1:]
                         if len(ln.split()) > 7]
                assert paths, result.stdout  # the runner's channel is listed
                for path in paths:
                    assert state not in path and str(tmp_path) not in path, result.stdout
                    assert path.startswith("/proc/self/fd/"), result.stdout
    finally:
        await b.close()
    assert labelled(docker_client, b.config.instance_name) == []
