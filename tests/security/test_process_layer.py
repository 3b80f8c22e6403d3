"""The process layer on its own: a worker confined exactly like the zygote confines it runs
*unrestricted* Python (as if RestrictedPython had been escaped) and must still be unable to read
secrets outside its workspace, write outside it, use the network, start processes or threads,
signal or trace other processes, gain privileges, or exceed its memory limit."""

from __future__ import annotations

import json
import os
import platform
import secrets
import subprocess
import sys
from pathlib import Path

from sandboxd.backends.restricted import landlock
from tests.support.ci import require

HELPER = Path(__file__).with_name("process_escape_helper.py")
MUST_FAIL = [
    "read_canary_abs", "read_canary_rel", "read_canary_dotdot", "read_proc_environ",
    "read_proc1_environ", "read_etc_passwd", "write_tmp", "socket_inet", "socket_unix",
    "socket_raw_syscall", "fork", "thread", "execve", "kill_zygote", "kill_init",
    "setuid_root", "ptrace_attach", "unshare_user", "mount_tmpfs", "io_uring_setup", "bpf",
    "keyctl", "perf_event_open", "chroot_escape", "memory_bomb", "shmget", "msgget", "semget",
    "prlimit_parent", "setpriority_parent", "setpriority_user", "sched_setaffinity_parent",
]


def run_helper(tmp_path: Path, *, chroot: bool, drop: bool) -> dict:
    os.chmod(tmp_path, 0o755)
    secret = "process-canary-" + secrets.token_hex(8)
    canary = tmp_path / "canary.txt"
    canary.write_text(secret)
    os.chmod(canary, 0o644)
    ws = tmp_path / "ws"
    ws.mkdir()
    if drop:
        os.chown(ws, 10001, 10001)
    pwned = f"/tmp/pwned_{secrets.token_hex(4)}"
    cfg = {
        "workspace": str(ws), "canary": str(canary), "pwned": pwned, "chroot": chroot,
        "uid": 10001 if drop else None, "memory": 64 * 1024 * 1024, "parent": os.getpid(),
        "instance": "esc" + secrets.token_hex(4),
    }
    proc = subprocess.run([sys.executable, str(HELPER), json.dumps(cfg)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert secret not in proc.stdout
    assert not Path(pwned).exists()
    assert canary.read_text() == secret
    results = json.loads(proc.stdout)
    assert "setup_error" not in results, results
    return results


def check(results: dict) -> None:
    leaked = {name: results[name] for name in MUST_FAIL if results[name][0]}
    assert not leaked, leaked
    assert "canary.txt" not in results["list_parent"][1]
    assert results["write_inside"][0], results["write_inside"]
    assert results["prlimit_self"][0], results["prlimit_self"]  # its own limits stay usable


def test_root_mode_chroot_uid_seccomp_landlock(tmp_path: Path) -> None:
    require(platform.machine() == "x86_64", "x86_64 (the helper uses raw syscall numbers)")
    require(os.geteuid() == 0, "root (the chroot/uid mode is used when the daemon is root)")
    results = run_helper(tmp_path, chroot=True, drop=True)
    check(results)
    assert results["uid_is_root"] == [True, "None"]  # returned None: not root


def test_landlock_alone_confines_the_filesystem(tmp_path: Path) -> None:
    """Without chroot and uid change (the daemon-not-root mode), Landlock and seccomp must
    still hold - even for a worker that kept uid 0 here."""
    require(platform.machine() == "x86_64", "x86_64 (the helper uses raw syscall numbers)")
    require(landlock.landlock_abi() > 0, "a kernel with Landlock (the non-root mode's boundary)")
    check(run_helper(tmp_path, chroot=False, drop=False))
