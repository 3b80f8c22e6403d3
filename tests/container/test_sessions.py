"""Session containers: one per session, fork per call, workspace persistence and isolation."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends.container import ContainerBackend
from sandboxd.models import Limits, Reason, Status
from sandboxd.protocol.plan import ExecutionPlan
from tests.support.plan import with_limits

from .conftest import DEFAULT_CALL_S, labelled, run, workspace

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIST_PROCS = (
    "import os\n"
    "procs = []\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        procs.append(open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\\0', b' ')"
    ".decode().strip())\n"
    "    except OSError:\n"
    "        pass\n"
    "procs"
)


def session_containers(docker_client: Any, backend: ContainerBackend, session: str) -> list[Any]:
    return docker_client.containers.list(all=True, filters={"label": [
        f"sandboxd.daemon={backend.config.instance_name}", f"sandboxd.session={session}"]})


async def test_workspace_persists_within_a_session(backend: ContainerBackend,
                                                   tmp_path: Path, docker_client: Any) -> None:
    ws = workspace(tmp_path, "s1")
    res = await run(backend, ws, session="s1", code="open('notes.txt', 'w').write('kept')")
    assert res.status is Status.ok, res
    res = await run(backend, ws, session="s1", argv=["cat", "notes.txt"])
    assert res.stdout == "kept"
    assert (ws / "notes.txt").read_text() == "kept"  # it is the session's host workspace
    # one container for the whole session
    for _ in range(3):
        await run(backend, ws, session="s1", argv=["true"])
    assert len(session_containers(docker_client, backend, "s1")) == 1
    await backend.close_session("s1")
    assert session_containers(docker_client, backend, "s1") == []
    await backend.close_session("s1")  # idempotent


async def test_workspace_not_shared_across_sessions_or_clients(backend: ContainerBackend,
                                                               tmp_path: Path) -> None:
    ws_a = workspace(tmp_path, "a")
    ws_b = workspace(tmp_path, "b")
    ws_c = workspace(tmp_path, "c")
    await run(backend, ws_a, session="sa", client="alice", argv=["touch", "secret-a"])
    res = await run(backend, ws_b, session="sb", client="alice", argv=["ls", "-A"])
    assert res.status is Status.ok and res.stdout == ""
    # the same session name for another client is another container and workspace
    res = await run(backend, ws_c, session="sa", client="mallory", argv=["ls", "-A", "/workspace"])
    assert res.stdout == ""
    res = await run(backend, ws_c, session="sa", client="mallory", code=(
        "import os\nsorted(os.listdir('/workspace'))"))
    assert res.value == []
    res = await run(backend, ws_a, session="sa", client="alice", argv=["ls"])
    assert res.stdout == "secret-a\n"
    for s in ("sa", "sb"):
        await backend.close_session(s)


async def test_oneshot_calls_never_see_each_others_files(backend: ContainerBackend,
                                                         tmp_path: Path) -> None:
    ws = workspace(tmp_path, "one")
    res = await run(backend, ws, code="open('/workspace/left.txt', 'w').write('x')\n"
                                      "import os\nos.listdir('/workspace')")
    assert res.value == ["left.txt"]
    res = await run(backend, ws, code="import os\nos.listdir('/workspace')")
    assert res.value == []


async def test_a_calls_processes_do_not_outlive_it(backend: ContainerBackend,
                                                   tmp_path: Path) -> None:
    ws = workspace(tmp_path, "bg")
    # the background sleep still holds stdout: the call ends shortly after its main process
    # (no waiting for the deadline) and the leftover is killed. The bound is half the
    # deadline: what it catches is a wait for the deadline, and the session container's
    # start counts (5.3 s once in the VM job, under emulation beside another lane)
    res = await run(backend, ws, session="bg", argv=["sh", "-c", "sleep 1000 & echo started"],
                    timeout=60)
    assert res.status is Status.ok, res
    assert res.resources.wall_ms < 30_000, res.resources
    assert res.stdout == "started\n", res
    assert res.cleanup.verified, res.cleanup
    res = await run(backend, ws, session="bg", code=LIST_PROCS)
    assert not any(p.startswith("sleep") for p in res.value), res.value
    await backend.close_session("bg")


async def test_timeout_in_a_session_replaces_its_container(backend: ContainerBackend,
                                                           tmp_path: Path,
                                                           docker_client: Any) -> None:
    ws = workspace(tmp_path, "to")
    await run(backend, ws, session="to", argv=["touch", "survives"])
    (first,) = session_containers(docker_client, backend, "to")
    res = await run(backend, ws, session="to", argv=["sleep", "100"], limits=Limits(timeout_s=1))
    assert res.termination.reason is Reason.wall_timeout
    assert res.cleanup.verified
    assert session_containers(docker_client, backend, "to") == []
    res = await run(backend, ws, session="to", argv=["ls"])
    assert res.stdout == "survives\n"
    (second,) = session_containers(docker_client, backend, "to")
    assert second.id != first.id
    await backend.close_session("to")


async def test_concurrent_calls_in_one_session(backend: ContainerBackend,
                                               tmp_path: Path, docker_client: Any) -> None:
    ws = workspace(tmp_path, "cc")
    results = await asyncio.gather(*(
        run(backend, ws, session="cc", code=f"import time\ntime.sleep(0.3)\n{i} * 2")
        for i in range(8)))
    assert [r.value for r in results] == [i * 2 for i in range(8)]
    assert all(r.status is Status.ok for r in results)
    assert len(session_containers(docker_client, backend, "cc")) == 1
    await backend.close_session("cc")


async def test_limits_follow_each_call_of_a_session(backend: ContainerBackend,
                                                    tmp_path: Path) -> None:
    ws = workspace(tmp_path, "lim")
    code = ("import os\n"
            "for p in ('/sys/fs/cgroup/memory.max', "
            "'/sys/fs/cgroup/memory/memory.limit_in_bytes'):\n"
            "    if os.path.exists(p):\n"
            "        v = int(open(p).read())\n"
            "v")
    res = await run(backend, ws, session="lim", code=code,
                    limits=Limits(timeout_s=DEFAULT_CALL_S, memory_bytes=200 * 1024 * 1024))
    assert res.value == 200 * 1024 * 1024
    res = await run(backend, ws, session="lim", code=code,
                    limits=Limits(timeout_s=DEFAULT_CALL_S, memory_bytes=100 * 1024 * 1024))
    assert res.value == 100 * 1024 * 1024
    await backend.close_session("lim")


async def test_memory_limit_in_a_session_keeps_the_workspace(backend: ContainerBackend,
                                                             tmp_path: Path) -> None:
    ws = workspace(tmp_path, "oom")
    await run(backend, ws, session="oom", argv=["touch", "before"])
    res = await run(backend, ws, session="oom", code="x = bytearray(300 * 1024 * 1024)",
                    limits=Limits(timeout_s=DEFAULT_CALL_S, memory_bytes=64 * 1024 * 1024))
    assert res.termination.reason is Reason.memory_limit, res
    res = await run(backend, ws, session="oom", argv=["ls"])
    assert res.stdout == "before\n"
    await backend.close_session("oom")


async def test_close_removes_everything(docker_client: Any, tmp_path: Path) -> None:
    from .conftest import make_settings

    b = ContainerBackend.from_settings(make_settings(tmp_path, warm_pool_size=2))
    await b.start()
    ws = workspace(tmp_path, "x")
    await run(b, ws, session="k1", argv=["true"])
    await run(b, ws, session="k2", argv=["true"])
    assert len(labelled(docker_client, b.config.instance_name)) >= 2
    await b.close()
    assert labelled(docker_client, b.config.instance_name) == []
    assert not (b.config.state_dir / "run").exists()


async def test_killing_the_runner_ends_in_an_error_and_a_fresh_container(
        backend: ContainerBackend, tmp_path: Path, docker_client: Any) -> None:
    """Code may kill the session's runner (same uid): the next call says so, fast, and the
    call after that gets a new container on the same workspace."""
    ws = workspace(tmp_path, "kill")
    await run(backend, ws, session="kill", argv=["touch", "kept"])
    res = await run(backend, ws, session="kill", code=(
        "import os, signal\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    cmd = open(f'/proc/{pid}/cmdline', 'rb').read()\n"
        "    if b'runner.py' in cmd and int(pid) not in (os.getpid(), os.getppid()):\n"
        "        os.kill(int(pid), signal.SIGKILL)\n"))
    # the call itself may or may not finish before the container goes down with its runner
    res = await run(backend, ws, session="kill", argv=["ls"])
    if res.status is Status.error:  # the stopped container was noticed by this call
        assert res.message and "runner" in res.message, res
        assert res.resources.wall_ms < 10_000
        res = await run(backend, ws, session="kill", argv=["ls"])
    assert res.stdout == "kept\n", res
    await backend.close_session("kill")
    assert session_containers(docker_client, backend, "kill") == []


async def test_a_timeout_cancels_concurrent_calls_of_the_same_session(
        backend: ContainerBackend, tmp_path: Path) -> None:
    ws = workspace(tmp_path, "conc")
    await run(backend, ws, session="conc", argv=["true"])  # the container exists
    slow, victim = await asyncio.gather(
        run(backend, ws, session="conc", argv=["sleep", "100"], limits=Limits(timeout_s=1)),
        run(backend, ws, session="conc", argv=["sleep", "8"]))
    assert slow.termination.reason is Reason.wall_timeout
    assert victim.termination.reason is Reason.cancelled, victim
    assert victim.status is Status.killed
    assert victim.message and "another call of the session hit a limit" in victim.message
    assert victim.cleanup.verified
    res = await run(backend, ws, session="conc", argv=["echo", "fresh"])
    assert res.stdout == "fresh\n"
    await backend.close_session("conc")


async def test_oneshot_with_a_prepared_workspace_mounts_it(backend: ContainerBackend,
                                                           tmp_path: Path) -> None:
    """A non-empty one-shot workspace cannot use a pool container: it is bind-mounted."""
    ws = workspace(tmp_path, "prepared")
    (ws / "input.txt").write_text("from the host\n")
    res = await run(backend, ws, argv=["cat", "input.txt"])
    assert res.status is Status.ok, res
    assert res.stdout == "from the host\n"


async def test_import_allowlist_is_applied_in_the_container(backend: ContainerBackend,
                                                            tmp_path: Path) -> None:
    from sandboxd.models import Invocation, ToolKind

    ws = workspace(tmp_path, "imp")
    inv = Invocation(tool="python", client="c", workspace=ws,
                     arguments={"code": "import json\nm = __import__('subprocess')"},
                     plan=ExecutionPlan(kind=ToolKind.python, imports_allow=("json", "math"),
                                        imports_deny=("subprocess",)))
    import time

    res = await backend.run(with_limits(inv, Limits()), time.monotonic() + DEFAULT_CALL_S)
    assert res.status is Status.error
    assert "import of 'subprocess' is not allowed by the policy" in res.stderr
    inv = inv.model_copy(update={"arguments": {"code": "import json, math\nmath.floor(2.5)"}})
    res = await backend.run(with_limits(inv, Limits()), time.monotonic() + DEFAULT_CALL_S)
    assert res.value == 2, res
