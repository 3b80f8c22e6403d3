"""Helper for test_process_layer.py: confine a forked worker exactly like the zygote does, then
run *unrestricted* Python in it (as if the language layer had been escaped) and report what
the process layer let through. Run as ``python process_escape_helper.py '<json config>'``."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import socket
import sys
import types
from pathlib import Path
from typing import Any


def _bare_import() -> None:
    pkg = Path(__file__).resolve().parent.parent.parent / "sandboxd"
    for name, path in (("sandboxd", pkg), ("sandboxd.backends", pkg / "backends"),
                       ("sandboxd.backends.restricted", pkg / "backends" / "restricted")):
        mod = types.ModuleType(name)
        mod.__path__ = [str(path)]
        sys.modules[name] = mod


def attempt(results: dict[str, Any], name: str, fn: Any) -> None:
    """Record ``[succeeded, detail]`` for one escape attempt."""
    try:
        out = fn()
        results[name] = [True, repr(out)[:200]]
    except BaseException as exc:
        results[name] = [False, f"{type(exc).__name__}: {exc}"[:200]]


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def write(path: str, text: str) -> int:
    with open(path, "w") as f:
        return f.write(text)


def attacks(cfg: dict[str, Any]) -> dict[str, Any]:
    libc = ctypes.CDLL(None, use_errno=True)

    def raw(nr: int, *args: int) -> int:
        res = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
        if res < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return res

    r: dict[str, Any] = {}
    canary = cfg["canary"]
    attempt(r, "read_canary_abs", lambda: read(canary))
    attempt(r, "read_canary_rel", lambda: read(os.path.relpath(canary, os.getcwd())))
    attempt(r, "read_canary_dotdot", lambda: read("../" * 12 + canary.lstrip("/")))
    attempt(r, "read_proc_environ", lambda: read("/proc/self/environ"))
    attempt(r, "read_proc1_environ", lambda: read("/proc/1/environ"))
    attempt(r, "read_etc_passwd", lambda: read("/etc/passwd"))
    attempt(r, "write_tmp", lambda: write(cfg["pwned"], "x"))
    attempt(r, "list_parent", lambda: os.listdir("../.."))
    attempt(r, "socket_inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    attempt(r, "socket_unix", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    attempt(r, "socket_raw_syscall", lambda: raw(41, 2, 1, 0))
    attempt(r, "fork", os.fork)
    attempt(r, "thread", lambda: __import__("threading").Thread(target=lambda: None).start())
    attempt(r, "execve", lambda: os.execv("/bin/sh", ["sh", "-c", "true"]))
    attempt(r, "kill_zygote", lambda: os.kill(cfg["parent"], 9))
    attempt(r, "kill_init", lambda: os.kill(1, 0))
    attempt(r, "setuid_root", lambda: os.setuid(0))
    attempt(r, "ptrace_attach", lambda: raw(101, 16, cfg["parent"], 0, 0))
    attempt(r, "unshare_user", lambda: raw(272, 0x10000000))
    attempt(r, "mount_tmpfs", lambda: raw(165, 0, 0, 0, 0, 0))
    attempt(r, "io_uring_setup", lambda: raw(425, 1, 0))
    attempt(r, "bpf", lambda: raw(321, 0, 0, 0))
    attempt(r, "keyctl", lambda: raw(250, 0, 0, 0, 0))
    attempt(r, "perf_event_open", lambda: raw(298, 0, 0, -1, -1, 0))
    attempt(r, "chroot_escape", lambda: raw(161, 0))
    attempt(r, "shmget", lambda: raw(29, 0, 4096, 0o1600))  # IPC_PRIVATE, IPC_CREAT|0600
    attempt(r, "msgget", lambda: raw(68, 0, 0o1600))
    attempt(r, "semget", lambda: raw(64, 0, 1, 0o1600))
    attempt(r, "prlimit_parent", lambda: raw(302, cfg["parent"], 0, 0, 0))
    attempt(r, "setpriority_parent", lambda: raw(141, 0, cfg["parent"], 19))
    attempt(r, "setpriority_user", lambda: raw(141, 2, os.getuid(), 19))
    attempt(r, "sched_setaffinity_parent", lambda: raw(203, cfg["parent"], 0, 0))
    attempt(r, "prlimit_self", lambda: raw(302, 0, 0, 0, 0))
    attempt(r, "memory_bomb", lambda: bytearray(2 * cfg["memory"]))
    attempt(r, "uid_is_root", lambda: (os.getuid() == 0 or os.geteuid() == 0) or None)
    attempt(r, "write_inside", lambda: write("inside.txt", "ok"))
    return r


def main() -> None:
    cfg = json.loads(sys.argv[1])
    _bare_import()
    from sandboxd.backends.restricted import cgroups, confine, contain, landlock, seccomp, worker
    from sandboxd.protocol.limits import Limits

    worker.preimport()
    layout = cgroups.CgroupLayout.detect(Path("/sys/fs/cgroup"), cfg["instance"])
    program = seccomp.SeccompProgram.build()
    r_fd, w_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r_fd)
        try:
            confine.prepare_worker([w_fd], layout, "escape", (cfg["memory"], 1.0, 16))
            spec = confine.ChildSpec(
                cgroup="escape", workspace=cfg["workspace"],
                limits=Limits(memory_bytes=cfg["memory"], cpus=1.0, pids=16), cpu_seconds=10,
                max_file_bytes=1 << 20,
                uid=cfg["uid"], gid=cfg["uid"], zygote_pid=os.getppid(),
                chroot=cfg["chroot"], baseline_vm=contain.vm_size(),
                landlock_abi=landlock.landlock_abi(),
            )
            confine.enter_sandbox(spec, layout, program)
            out = attacks(cfg)
        except BaseException as exc:
            out = {"setup_error": f"{type(exc).__name__}: {exc}"}
        os.write(w_fd, json.dumps(out).encode())
        os._exit(0)
    os.close(w_fd)
    data = b""
    while chunk := os.read(r_fd, 65536):
        data += chunk
    os.waitpid(pid, 0)
    layout.remove("escape")
    for base in layout.bases.values():
        with contextlib.suppress(OSError):
            base.rmdir()
    print(data.decode())


if __name__ == "__main__":
    if platform.machine() != "x86_64":  # the raw syscall numbers above are x86_64 Linux
        raise SystemExit("unsupported platform")
    main()
