"""The daemon runs under the confinement of systemd/sandboxd.service.

systemd is not PID 1 here, so the tests cannot `systemctl start` the unit. Instead
tests/service/unit_sandbox.py reads the unit and applies, without systemd, what it asks for at
the syscall and capability level: the seccomp filters of SystemCallFilter=,
SystemCallErrorNumber=, MemoryDenyWriteExecute=, RestrictAddressFamilies= and
RestrictNamespases=, NoNewPrivileges=, the CapabilityBoundingSet=, and a cgroup of its own
(Delegate=yes) - then execs the daemon on a unix socket as ExecStart= does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.procs import audit_verify, cgroup_dirs, descendants
from tests.service.unit_sandbox import bounding_set, capability_numbers, unit_settings
from tests.support.daemon import PASSED_SETTINGS, uid_range_env
from tests.support.wait import wait_until

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LAUNCHER = HERE / "unit_sandbox.py"

PROBE = r"""
import ctypes, errno, json, mmap, os, socket
out = {}
libc = ctypes.CDLL(None, use_errno=True)
def attempt(key, fn):
    try:
        fn()
        out[key] = "allowed"
    except OSError as e:
        out[key] = errno.errorcode.get(e.errno, str(e.errno))
def c(fn, *args):
    def call():
        if fn(*args) != 0:
            raise OSError(ctypes.get_errno(), "")
    return call
attempt("inet", lambda: socket.socket(socket.AF_INET).close())
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW).close())
attempt("unix", lambda: socket.socket(socket.AF_UNIX).close())
attempt("wx_mmap", lambda: mmap.mmap(-1, 4096,
        prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC))
attempt("unshare", c(libc.unshare, 0x04000000))
attempt("sethostname", c(libc.sethostname, b"x", 1))
attempt("mount", c(libc.mount, b"none", b"/mnt", b"tmpfs", 0, None))
attempt("chroot", c(libc.chroot, b"/"))
out["ctypes_callback"] = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(lambda x: x * 2)(21)
pid = os.fork()
if pid == 0:
    os._exit(7)
out["fork"] = os.waitpid(pid, 0)[1] >> 8
status = dict(l.split(":", 1) for l in open("/proc/self/status"))
out["cap_eff"] = int(status["CapEff"], 16)
out["cap_bnd"] = int(status["CapBnd"], 16)
out["no_new_privs"] = status["NoNewPrivs"].strip()
out["seccomp"] = status["Seccomp"].strip()
print(json.dumps(out))
"""


NONROOT = REPO / "systemd" / "sandboxd-nonroot.conf"
DOCKER = REPO / "systemd" / "sandboxd-docker.conf"
QUOTA = REPO / "systemd" / "sandboxd-quota.conf"
NONROOT_UID = 10999  # stands in for the `sandboxd` system user of the drop-in


def _unit_cap_mask(dropins: tuple[Path, ...] = ()) -> int:
    caps = bounding_set(unit_settings(dropins=dropins))
    return sum(1 << n for n in capability_numbers(caps))


def _landlock() -> bool:
    """Whether this kernel enforces Landlock (landlock_create_ruleset's ABI version query)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": 444, "aarch64": 444}.get(os.uname().machine)
    if nr is None:
        return False
    return libc.syscall(nr, None, ctypes.c_size_t(0), ctypes.c_uint32(1)) >= 1


def _python_for(uid: int, where: Path) -> str:
    """An interpreter ``uid`` may run that imports the package under test: sys.executable for
    root; for others a virtualenv of the system python3 (ours may live under /root) seeing our
    tree and dependencies through a .pth file (the backend re-executes sys.executable for its
    zygote with a clean environment, so PYTHONPATH would not do)."""
    if uid == 0:
        return sys.executable
    import pydantic

    site = Path(pydantic.__file__).resolve().parents[1]
    venv = where / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    (pth_dir,) = venv.glob("lib/python3*/site-packages")
    # the tree's two packages: sandboxd, and the client it carries (client/sandboxd_client)
    (pth_dir / "sandboxd-under-test.pth").write_text(f"{REPO}\n{REPO / 'client'}\n{site}\n")
    return str(venv / "bin" / "python")


@pytest.fixture
def world_tmp() -> Iterator[Path]:
    """A scratch directory other users can traverse (pytest's tmp_path is root-only)."""
    d = Path(tempfile.mkdtemp(prefix="sandboxd-unit-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def service_cgroups() -> Iterator[list[Path]]:
    """The service's own cgroup (what systemd creates for the unit, delegated)."""
    name = f"sandboxd-unit-{uuid.uuid4().hex[:10]}.service"
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        dirs = [root / name]
    else:
        dirs = [root / c / name for c in ("memory", "cpu", "pids") if (root / c).is_dir()]
    for d in dirs:
        d.mkdir()
    try:
        yield dirs
    finally:
        for d in dirs:
            _remove_cgroup_tree(d)


def _remove_cgroup_tree(d: Path, timeout: float = 10.0) -> None:
    """Kill whatever is still inside (a failed test may leave workers), then rmdir bottom-up."""
    def removed() -> bool:
        if not d.exists():
            return True
        subdirs = sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(str(p)))
        for sub in [*subdirs, d]:
            with contextlib.suppress(OSError, ValueError):
                for pid in (sub / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            with contextlib.suppress(OSError):
                sub.rmdir()
        return not d.exists()

    with contextlib.suppress(AssertionError):  # best effort, as every clean-up here
        wait_until(removed, timeout=timeout, interval=0.1, what=f"{d} removed")


def _launch(
    cmd: list[str],
    *,
    cgroups: list[Path] = (),
    dropins: list[Path] = (),
    user: tuple[int, int] | None = None,
    env: dict[str, str] | None = None,
    **kw: object,
) -> subprocess.Popen[str]:
    args = [sys.executable, str(LAUNCHER)]
    for d in cgroups:
        args += ["--cgroup", str(d)]
    for f in dropins:
        args += ["--dropin", str(f)]
    if user is not None:
        args += ["--user", f"{user[0]}:{user[1]}"]
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("SANDBOXD_") or k in PASSED_SETTINGS}
    return subprocess.Popen([*args, "--", *cmd], env={**base, **(env or {})}, text=True, **kw)


def test_emulated_unit_confinement_holds(tmp_path: Path) -> None:
    """The emulation really enforces what the unit says (so the daemon test below means it)."""
    if os.geteuid() != 0:
        pytest.fail("the unit runs the daemon as root (bounded capabilities): run as root")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    proc = _launch([sys.executable, str(probe)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    result = json.loads(out)
    assert result["inet"] == "EAFNOSUPPORT"  # RestrictAddressFamilies=AF_UNIX
    assert result["netlink"] == "EAFNOSUPPORT"
    assert result["unix"] == "allowed"
    assert result["wx_mmap"] == "EPERM"  # MemoryDenyWriteExecute=yes
    assert result["unshare"] == "EPERM"  # RestrictNamespaces=yes
    assert result["sethostname"] == "EPERM"  # denied by name (and no CAP_SYS_ADMIN)
    assert result["mount"] == "EPERM"  # ~@mount
    assert result["chroot"] == "allowed"  # workers chroot into their workspace
    assert result["ctypes_callback"] == 42  # ctypes (pyseccomp) still works under MDWE
    assert result["fork"] == 7  # the zygote forks workers
    assert result["cap_bnd"] == _unit_cap_mask() == result["cap_eff"]
    assert result["no_new_privs"] == "1" and result["seccomp"] == "2"


# The VM's service job is tests/vm/guest/service-checks.sh. It installs neither the nonroot nor
# the quota drop-in: those variants are proven here only, so they keep running in the VM.
UNDER_REAL_SYSTEMD_IN_THE_VM = pytest.mark.same_on_every_host(
    "the VM's service job runs this variant under the real unit and systemd (the install, "
    "per-call cgroups, the container backend's calls under sandboxd-docker.conf); the "
    "emulation is for hosts without systemd")


@pytest.mark.parametrize("variant", [
    pytest.param("shipped", marks=UNDER_REAL_SYSTEMD_IN_THE_VM),
    "nonroot",
    pytest.param("docker", marks=UNDER_REAL_SYSTEMD_IN_THE_VM),
    "quota",
])
def test_daemon_serves_under_the_units_confinement(
    world_tmp: Path, service_cgroups: list[Path], variant: str, request: pytest.FixtureRequest
) -> None:
    """The shipped unit (root, six capabilities), the sandboxd-nonroot.conf drop-in (no
    capability; needs Landlock, else the daemon must refuse to start), the sandboxd-docker.conf
    drop-in (the container backend, under the same six capabilities) and the
    sandboxd-quota.conf drop-in (plus CAP_SYS_ADMIN and mount: a tmpfs per workspace). Without
    the quota drop-in the daemon cannot mount: it serves, and says its quota is advisory."""
    dropins = {"nonroot": (NONROOT,), "docker": (DOCKER,), "quota": (QUOTA,)}.get(variant, ())
    if variant == "docker":
        request.getfixturevalue("docker_client")  # engine and images, or fail in CI
    uid = NONROOT_UID if variant == "nonroot" else 0
    tmp_path = world_tmp
    state, run, logs = (tmp_path / n for n in ("state", "run", "logs"))
    for d in (state, run, logs):
        d.mkdir(mode=0o750)
        os.chown(d, uid, uid)
    if uid:  # what Delegate=yes does for User=
        for d in service_cgroups:
            for f in (d, d / "cgroup.procs", d / "tasks", d / "cgroup.subtree_control"):
                if f.exists():
                    os.chown(f, uid, uid)
    sock = run / "sandboxd.sock"
    notify_path = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(notify_path))
    os.chown(notify_path, uid, uid)
    listener.settimeout(120)
    log_path = tmp_path / "daemon.log"
    with open(log_path, "w") as log:
        proc = _launch(
            [
                _python_for(uid, tmp_path),
                "-m",
                "sandboxd",
                "serve",
                "--uds",
                str(sock),
                "--state-dir",
                str(state),
                "--audit-log",
                str(logs / "audit.jsonl"),
            ],
            cgroups=service_cgroups,
            dropins=list(dropins),
            user=(uid, uid) if uid else None,
            env={
                "NOTIFY_SOCKET": str(notify_path),
                "SANDBOXD_CONTAINER_ENABLED": "true" if variant == "docker" else "false",
                "SANDBOXD_WARM_POOL_SIZE": "1",
                "HOME": str(state),
                "SANDBOXD_SESSION_QUOTA_BYTES": str(4 * 1024 * 1024),
                **uid_range_env(),  # a root daemon claims its range host-wide
                # the drop-in's Environment= (the emulation applies only its confinement)
                **({"SANDBOXD_WORKSPACE_QUOTA": "kernel"} if variant == "quota" else {}),
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd="/",
        )

    def daemon_log() -> str:
        return log_path.read_text()[-4000:]

    try:
        if variant == "nonroot" and not _landlock():
            code = proc.wait(120)
            assert code != 0, daemon_log()
            assert "write_outside_blocked" in daemon_log(), daemon_log()
            return
        try:
            ready = listener.recv(4096).decode()
        except TimeoutError:
            pytest.fail(f"no READY=1 from the confined daemon:\n{daemon_log()}")
        assert "READY=1" in ready.split("\n"), f"{ready!r}\n{daemon_log()}"
        wait_until(sock.exists, timeout=10, what="the unix socket")
        status = Path(f"/proc/{proc.pid}/status").read_text()
        assert "\nSeccomp:\t2" in status and "\nNoNewPrivs:\t1" in status
        assert f"\nCapEff:\t{_unit_cap_mask(dropins):016x}" in status
        assert f"\nUid:\t{uid}\t" in status
        assert cgroup_dirs(proc.pid) >= set(service_cgroups) or any(
            str(c) in str(d) for c in service_cgroups for d in cgroup_dirs(proc.pid)
        )
        transport = httpx.HTTPTransport(uds=str(sock))
        with httpx.Client(base_url="http://sandboxd", transport=transport, timeout=120) as c:
            r = c.get("/readyz")
            assert r.status_code == 200, f"{r.text}\n{daemon_log()}"
            checks = {ch["name"]: ch for ch in r.json()["backends"]["restricted"]["checks"]}
            assert all(ch["ok"] for ch in checks.values()), checks
            if _landlock():  # the unit must not filter out the workers' Landlock syscalls
                assert "enforced" in checks["landlock"]["detail"], checks["landlock"]
            quota = r.json()["workspace_quota"]
            if variant == "quota":
                assert quota["mode"] == "kernel" and quota["ok"], quota
            else:  # no CAP_SYS_ADMIN, no mount(): the daemon serves, with an advisory quota
                assert quota["mode"] == "advisory" and quota["ok"], quota
                assert "CAP_SYS_ADMIN" in quota["detail"], quota
            r = c.post(
                "/v1/tools/python/invoke",
                json={"arguments": {"code": "import json\njson.dumps({'a': [1, 2]})"}},
            )
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["status"] == "ok", body
            assert body["value"] == '{"a": [1, 2]}'
            assert body["cleanup"]["verified"] is True
            # a session workspace (chowned to the sandbox identity), written then read back
            r = c.post("/v1/sessions", json={})
            assert r.status_code == 201, r.text
            sid = r.json()["id"]
            code = "with open('f.txt', 'w') as f:\n    f.write('hi')\nopen('f.txt').read()"
            r = c.post(
                "/v1/tools/python/invoke", json={"arguments": {"code": code}, "session": sid}
            )
            assert r.status_code == 200 and r.json()["value"] == "hi", r.text
            # the session's kernel is proven idle from /proc without CAP_SYS_PTRACE
            # (read as the sandbox's uid), so its state lives on into the next call
            r = c.post("/v1/tools/python/invoke",
                       json={"arguments": {"code": "f = 1\nf + 1"}, "session": sid})
            kernel = r.json()["kernel"]
            assert r.json()["value"] == 2 and kernel["lost"] is False, r.text
            assert kernel["calls"] == 2, r.text
            if variant == "docker":
                _container_calls(c, sid)
            if variant == "quota":  # the kernel holds the quota during the call
                code = "for i in range(8):\n    open(f'b{i}', 'w').write('x' * 1048576)\n"
                r = c.post(
                    "/v1/tools/python/invoke", json={"arguments": {"code": code}, "session": sid}
                )
                body = r.json()
                assert body["status"] == "error", body
                assert "the workspace quota of 4 MiB is full" in body["message"], body
                mounts = Path("/proc/self/mountinfo").read_text()
                assert f"{state}/workspaces/{sid} " in mounts
            assert c.delete(f"/v1/sessions/{sid}").status_code == 204
            assert f"{state}/workspaces/" not in Path("/proc/self/mountinfo").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, daemon_log()
        assert not descendants(proc.pid)
        listener.settimeout(5)
        messages = []
        with contextlib.suppress(TimeoutError):
            while True:
                messages.append(listener.recv(4096).decode())
        assert any("STOPPING=1" in m.split("\n") for m in messages), messages
        verify = audit_verify(logs / "audit.jsonl")
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert (
            not list((state / "workspaces").glob("*")) if (state / "workspaces").exists() else True
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        listener.close()


def _container_calls(c: httpx.Client, sid: str) -> None:
    """Under the unit's capabilities: one-shot and session shell calls, and the limits."""
    ready = c.get("/readyz").json()["backends"]["container"]
    assert ready["available"] and ready["ok"], ready
    r = c.post("/v1/tools/shell/invoke", json={"arguments": {"command": "echo hello"}})
    assert (r.json()["status"], r.json()["stdout"]) == ("ok", "hello\n"), r.text
    r = c.post("/v1/tools/shell/invoke",
               json={"arguments": {"command": "cat f.txt"}, "session": sid})
    assert (r.json()["status"], r.json()["stdout"]) == ("ok", "hi"), r.text
    r = c.post("/v1/tools/shell/invoke",
               json={"arguments": {"command": "python3 -c 'x = bytearray(1024**3)'"},
                     "limits": {"memory_bytes": 128 * 1024 * 1024}})
    body = r.json()
    assert body["termination"]["reason"] == "memory_limit", body
    assert body["cleanup"]["verified"] is True
