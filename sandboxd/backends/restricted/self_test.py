"""The readiness self-test a fully confined worker runs on itself (:mod:`.probe` asks for it):
socket blocked, write outside the workspace blocked, Landlock, unprivileged, its own PID
namespace, seccomp (fork denied), or the memory limit. Trusted code, no user input; loaded
with the worker, before it forks (it can import nothing once confined)."""

from __future__ import annotations

import errno
import os
import socket

from sandboxd.protocol.call import WorkerReport, WorkerRequest


def self_test(msg: WorkerRequest) -> WorkerReport:
    """Trusted self-test code run inside a fully confined worker (readiness probe)."""
    if msg.restricted.probe == "memory":
        return _memory_probe(msg.limits.memory_bytes)
    # in this order: the seccomp check forks last
    checks = {
        "socket_blocked": _socket_blocked(),
        "write_outside_blocked": _write_outside_blocked(msg.restricted.outside_path),
        **_identity_checks(msg),
        "seccomp": _seccomp_enforced(),
    }
    return WorkerReport(outcome="ok", probe=checks)


def _memory_probe(limit: int) -> WorkerReport:
    """Allocate up to three times the memory limit: ``MemoryError`` must stop it first."""
    blocks: list[bytes] = []
    try:
        while len(blocks) * (4 << 20) < 3 * limit:
            blocks.append(b"x" * (4 << 20))
    except MemoryError:
        return WorkerReport(outcome="memory_limit", probe={
            "memory_limit": (True, f"MemoryError after {len(blocks) * 4} MiB")})
    return WorkerReport(outcome="ok", probe={
        "memory_limit": (False, f"allocated {len(blocks) * 4} MiB without hitting the limit")})


def _socket_blocked() -> tuple[bool, str]:
    """``socket()`` must fail with EPERM (the seccomp filter)."""
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.close()
        return (False, "socket() succeeded")
    except OSError as exc:
        return (exc.errno == errno.EPERM, f"socket(): {exc}")


def _write_outside_blocked(target: str) -> tuple[bool, str]:
    """Writing ``target``, outside the workspace, must fail."""
    try:
        with open(target, "w") as f:
            f.write("escaped")
        return (False, f"wrote {target}")
    except OSError as exc:
        return (True, f"open(outside, 'w'): {type(exc).__name__}")


def _identity_checks(msg: WorkerRequest) -> dict[str, tuple[bool, str]]:
    """Landlock enforced (where the kernel has it), not root (when the daemon is), and PID 1
    of its own PID namespace (when the daemon gives it one)."""
    from sandboxd.backends.restricted import landlock

    uid = os.getuid()
    abi = landlock.landlock_abi()
    pid = os.getpid()
    no_namespace = f"pid {pid}: no PID namespace" + (
        f" ({msg.restricted.no_namespaces_reason}; sandboxes are separated by uid and seccomp)"
        if msg.restricted.no_namespaces_reason else "")
    return {
        "landlock": (abi == 0 or landlock.LANDLOCK_STATUS.startswith("enforced"),
                     landlock.LANDLOCK_STATUS),
        "unprivileged": (uid != 0 or not msg.restricted.expect_unprivileged, f"uid {uid}"),
        "pid_namespace": (pid == 1 or not msg.restricted.expect_namespaces,
                          f"pid {pid} in its own PID namespace" if pid == 1 else no_namespace),
    }


def _seccomp_enforced() -> tuple[bool, str]:
    """Seccomp filter mode (2), and ``fork`` denied."""
    from sandboxd.backends.restricted import contain

    try:
        mode = contain.prctl(contain.PR_GET_SECCOMP)
    except OSError:
        mode = -1
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        forked = True
    except OSError:
        forked = False
    return (mode == 2 and not forked,
            f"seccomp mode {mode}, fork {'allowed' if forked else 'denied'}")
