"""Every container is confined: its sandbox's own uid, read-only root, no network, seccomp,
clean env."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from sandboxd.backends.container import ContainerBackend
from sandboxd.models import Invocation, Limits, Reason, Status, ToolKind
from sandboxd.protocol.plan import ExecutionPlan
from tests.support.ci import require
from tests.support.plan import with_limits

from .conftest import DEFAULT_CALL_S, SANDBOX_UID, labelled, make_settings, run

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_runs_as_the_sandbox_uid(backend: ContainerBackend, ws: Path) -> None:
    res = await run(backend, ws, argv=["id", "-u"])
    assert res.status is Status.ok, res
    assert res.stdout.strip() == str(SANDBOX_UID)
    assert res.backend == "container"
    assert res.cleanup.verified
    # an empty workspace: a warm container, which holds its own uid of the pool
    res = await run(backend, ws, code="import os\n(os.getuid(), os.getgid(), os.getgroups())")
    uid = res.value[0]
    assert res.value == [uid, uid, [uid]], res
    assert backend.uids is None or backend.uids.contains(uid), res


async def test_no_capabilities_and_no_new_privs(backend: ContainerBackend, ws: Path) -> None:
    res = await run(backend, ws, argv=["grep", "-E", "^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):",
                                       "/proc/self/status"])
    fields = dict(line.split(":\t") for line in res.stdout.splitlines())
    assert int(fields["CapEff"], 16) == 0
    assert int(fields["CapPrm"], 16) == 0
    assert int(fields["CapBnd"], 16) == 0
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2"  # filter mode


@pytest.mark.parametrize("target", ["/x", "/etc/passwd", "/usr/bin/evil", "/opt/sandboxd/x",
                                    "/run/sandboxd/x"])
async def test_write_outside_workspace_fails(backend: ContainerBackend, ws: Path,
                                             target: str) -> None:
    res = await run(backend, ws, argv=["touch", target])
    assert res.status is Status.error, res
    assert res.termination.exit_code != 0
    assert "Read-only file system" in res.stderr or "Permission denied" in res.stderr, res.stderr


async def test_workspace_and_tmp_are_writable(backend: ContainerBackend, ws: Path) -> None:
    res = await run(backend, ws, code=(
        "open('/workspace/a.txt', 'w').write('hello')\n"
        "open('/tmp/b.txt', 'w').write('tmp')\n"
        "open('/workspace/a.txt').read() + open('/tmp/b.txt').read()"))
    assert res.status is Status.ok, res
    assert res.value == "hellotmp"


async def test_tmp_is_noexec(backend: ContainerBackend, ws: Path) -> None:
    res = await run(backend, ws, code=(
        "import os, subprocess\n"
        "open('/tmp/x.sh', 'w').write('#!/bin/sh\\necho ran\\n')\n"
        "os.chmod('/tmp/x.sh', 0o755)\n"
        "try:\n"
        "    subprocess.run(['/tmp/x.sh'])\n"
        "    r = 'executed'\n"
        "except PermissionError:\n"
        "    r = 'refused'\n"
        "r"))
    assert res.value == "refused", res


async def test_no_network(backend: ContainerBackend, ws: Path) -> None:
    res = await run(backend, ws, code=(
        "import socket\n"
        "out = []\n"
        "for addr in [('1.1.1.1', 53), ('8.8.8.8', 443), ('172.17.0.1', 2375)]:\n"
        "    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
        "    s.settimeout(2)\n"
        "    try:\n"
        "        s.connect(addr)\n"
        "        out.append('connected')\n"
        "    except OSError as exc:\n"
        "        out.append(type(exc).__name__)\n"
        "import os\n"
        "ifaces = sorted(os.listdir('/sys/class/net'))\n"
        "[out, ifaces]"))
    assert res.status is Status.ok, res
    attempts, ifaces = res.value
    assert "connected" not in attempts
    assert ifaces == ["lo"]


async def test_netlink_and_raw_sockets_refused(backend: ContainerBackend, ws: Path) -> None:
    res = await run(backend, ws, code=(
        "import socket\n"
        "out = []\n"
        "for fam, typ in [(socket.AF_NETLINK, socket.SOCK_RAW),"
        " (socket.AF_PACKET, socket.SOCK_RAW), (socket.AF_INET, socket.SOCK_RAW)]:\n"
        "    try:\n"
        "        socket.socket(fam, typ)\n"
        "        out.append('open')\n"
        "    except OSError as exc:\n"
        "        out.append(exc.errno)\n"
        "out"))
    assert "open" not in res.value, res


async def test_seccomp_blocks_unshare_mount_ptrace(backend: ContainerBackend, ws: Path) -> None:
    res = await run(backend, ws, code=(
        "import ctypes, errno\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def call(fn, *args):\n"
        "    r = fn(*args)\n"
        "    return (r, ctypes.get_errno())\n"
        "{\n"
        " 'unshare_user': call(libc.unshare, 0x10000000),\n"
        " 'unshare_ns': call(libc.unshare, 0x00020000),\n"
        " 'mount': call(libc.mount, b'none', b'/tmp', b'tmpfs', 0, None),\n"
        " 'ptrace': call(libc.ptrace, 16, 1, None, None),\n"
        " 'keyctl': call(libc.syscall, 250, 0, 0, 0, 0),\n"
        " 'bpf': call(libc.syscall, 321, 0, 0, 0),\n"
        " 'userfaultfd': call(libc.syscall, 323, 0),\n"
        " 'personality': call(libc.personality, 0x0040000),\n"
        "}"))
    assert res.status is Status.ok, res
    for name, (ret, err) in res.value.items():
        assert ret == -1, f"{name} succeeded"
        assert err == 1, f"{name}: errno {err}, expected EPERM from the seccomp profile"
    # the unshare(1) program says the same
    res = await run(backend, ws, argv=["unshare", "--user", "true"])
    assert res.status is Status.error
    assert "Operation not permitted" in res.stderr, res.stderr


async def test_threads_and_subprocesses_still_work(backend: ContainerBackend, ws: Path) -> None:
    res = await run(backend, ws, code=(
        "import subprocess, threading\n"
        "box = []\n"
        "t = threading.Thread(target=box.append, args=(1,)); t.start(); t.join()\n"
        "p = subprocess.run(['git', '--version'], capture_output=True, text=True)\n"
        "[box, p.stdout.split()[0]]"))
    assert res.value == [[1], "git"], res


async def test_host_environment_not_visible(backend: ContainerBackend, ws: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "s3cr3t-" + os.urandom(6).hex()
    monkeypatch.setenv("SANDBOXD_TEST_SECRET", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    res = await run(backend, ws, code="import os\ndict(os.environ)")
    assert secret not in str(res.value)
    assert set(res.value) <= {"PATH", "HOME", "LANG", "TMPDIR", "PYTHONDONTWRITEBYTECODE",
                              "PYTHONUNBUFFERED", "MPLBACKEND", "MPLCONFIGDIR"}, res.value
    # nor in any process of the container (init, runner, handler)
    res = await run(backend, ws, code=(
        "import os\n"
        "envs = []\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        envs.append(open(f'/proc/{pid}/environ', 'rb').read().decode())\n"
        "    except OSError:\n"
        "        pass\n"
        "envs"))
    assert res.status is Status.ok, res
    assert len(res.value) >= 2  # init and the call's process (the runner is non-dumpable)
    assert not any(secret in env for env in res.value)
    assert not any("SANDBOXD_TEST_SECRET" in env for env in res.value)


async def test_argv_is_not_interpreted_by_a_shell(backend: ContainerBackend, ws: Path) -> None:
    res = await run(backend, ws, argv=["echo", "$(id)", "`id`", ";", "id", "|", "cat", "*"])
    assert res.stdout == "$(id) `id` ; id | cat *\n"


async def test_python_value_stdout_stderr_and_errors(backend: ContainerBackend,
                                                     ws: Path) -> None:
    res = await run(backend, ws, code="import sys\nprint('out')\nprint('err', file=sys.stderr)\n"
                                      "{'a': [1, 2.5, None]}")
    assert (res.status, res.stdout, res.stderr, res.value) == (
        Status.ok, "out\n", "err\n", {"a": [1, 2.5, None]})
    res = await run(backend, ws, code="object()")
    assert res.value.startswith("<object object at")  # not JSON: its repr
    res = await run(backend, ws, code="1/0")
    assert res.status is Status.error
    assert res.termination.reason is Reason.exited and res.termination.exit_code == 1
    assert "ZeroDivisionError" in res.stderr
    res = await run(backend, ws, code="raise SystemExit(7)")
    assert res.termination.exit_code == 7


async def test_command_not_found(backend: ContainerBackend, ws: Path) -> None:
    res = await run(backend, ws, argv=["no-such-program"])
    assert res.status is Status.error
    assert res.termination.exit_code == 127
    assert "command not found" in res.stderr


async def test_probe_proves_confinement(backend: ContainerBackend) -> None:
    report = await backend.probe()
    assert report.ok, report
    names = {c.name for c in report.checks}
    assert {"unprivileged", "socket_blocked", "write_outside_blocked", "memory_limit",
            "seccomp"} <= names


@pytest.mark.same_on_every_host(
    "the self-test's wall-clock limit comes from the settings: the daemon's own arithmetic; "
    "test_probe_proves_confinement proves the probe itself in the VM")
async def test_probe_calls_get_the_configured_wall_limit(tmp_path: Path,
                                                         docker_client: Any) -> None:
    """``probe_call_timeout_s`` is each self-test call's limit: a limit too short for any
    container says so in the report (and leaves nothing behind)."""
    settings = make_settings(tmp_path, probe_call_timeout_s=0.05, warm_pool_size=0)
    backend = ContainerBackend.from_settings(settings)
    await backend.start()
    try:
        assert backend.config.probe_call_timeout_s == 0.05
        report = await backend.probe()
        assert not report.ok
        assert "wall-clock limit of 0.05 s" in report.detail, report
    finally:
        await backend.close()
    assert labelled(docker_client, settings.instance_name) == []


async def test_every_container_has_the_hardened_config(backend: ContainerBackend, ws: Path,
                                                       docker_client: Any) -> None:
    """Inspect a live session container: the engine-side config matches the contract."""
    res = await run(backend, ws, argv=["true"], session="inspect-me")
    assert res.status is Status.ok
    (container,) = docker_client.containers.list(
        filters={"label": ["sandboxd.session=inspect-me",
                           f"sandboxd.daemon={backend.config.instance_name}"]})
    hc = container.attrs["HostConfig"]
    cfg = container.attrs["Config"]
    assert cfg["User"] == f"{SANDBOX_UID}:{SANDBOX_UID}"
    assert hc["ReadonlyRootfs"] is True
    assert hc["CapDrop"] == ["ALL"]
    assert hc["NetworkMode"] == "none"
    assert hc["Init"] is True
    assert hc["Memory"] == hc["MemorySwap"] > 0
    assert hc["NanoCpus"] > 0 and hc["PidsLimit"] > 0
    assert any(opt.startswith("no-new-privileges") for opt in hc["SecurityOpt"])
    assert any(opt.startswith("seccomp=") for opt in hc["SecurityOpt"])
    ulimits = {u["Name"]: u for u in hc["Ulimits"]}
    assert ulimits["core"]["Hard"] == 0 and "nofile" in ulimits and "fsize" in ulimits
    assert "noexec" in hc["Tmpfs"]["/tmp"]
    assert cfg["Labels"]["sandboxd.invocation"].startswith("inv_")
    env_names = {e.split("=", 1)[0] for e in cfg["Env"]}
    assert env_names <= {"PATH", "LANG", "PYTHONDONTWRITEBYTECODE", "HOSTNAME"}, env_names
    mounts = {m["Destination"]: m for m in container.attrs["Mounts"]}
    assert mounts["/run/sandboxd"]["RW"] is False
    assert mounts["/workspace"]["Source"] == str(ws)
    await backend.close_session("inspect-me")
    assert docker_client.containers.list(all=True,
                                         filters={"label": "sandboxd.session=inspect-me"}) == []


async def test_concurrent_containers_never_share_a_uid(backend: ContainerBackend,
                                                       tmp_path: Path) -> None:
    """Each call holds its own uid (as the daemon gives it) and a warm container has its own:
    concurrent calls run as pairwise different uids, each the one its sandbox holds."""
    require(os.geteuid() == 0, "root (the uid pool exists when the daemon is root)")
    pool = backend.uids
    assert pool is not None
    code = "import os, time\ntime.sleep(1)\nos.getuid()"
    calls = []
    for i in range(3):
        uid = pool.acquire(f"call-{i}")
        ws = tmp_path / f"w{i}"
        ws.mkdir(mode=0o700)
        os.chown(ws, uid, uid)
        inv = Invocation(tool="python", client="tester", workspace=ws,
                         arguments={"code": code}, uid=uid,
                         plan=ExecutionPlan(kind=ToolKind.python, limits=Limits(timeout_s=30),
                                            imports_allow=("*",)))
        # three containers start at once: 120 s under emulation (conftest.DEFAULT_CALL_S)
        calls.append(backend.run(with_limits(inv, Limits(timeout_s=DEFAULT_CALL_S)),
                                 time.monotonic() + DEFAULT_CALL_S))
    try:
        results = await asyncio.gather(*calls)
    finally:
        for i in range(3):
            pool.release(f"call-{i}")
    uids = [r.value for r in results]
    assert all(r.status is Status.ok for r in results), results
    assert len(set(uids)) == 3, uids
    assert all(pool.contains(u) for u in uids), uids
