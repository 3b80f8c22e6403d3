"""The restricted backend's readiness self-test: trusted probes run in fully confined workers
(socket blocked, write outside the workspace blocked, memory limit enforced, unprivileged when
root, seccomp, Landlock, PID namespace), plus the cgroup layout and the cleanup proof.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxd.backends.call import BackendCall
from sandboxd.backends.restricted import health, standby
from sandboxd.backends.restricted.outcome import BACKEND_NAME
from sandboxd.backends.restricted.worker_call import WorkerCall
from sandboxd.models import Invocation, Limits, ProbeCheck, ProbeReport, Reason, Result
from sandboxd.protocol.plan import ExecutionPlan, ToolKind
from sandboxd.workspaces import fstree

if TYPE_CHECKING:
    from sandboxd.backends.restricted.backend import RestrictedBackend

#: deadline of each self-test probe: a bound that only a hung worker reaches (a slow or
#: emulated host takes seconds to fill the 64 MiB the memory probe needs)
PROBE_DEADLINE_S = 60.0
#: name prefix of the probes' directories under the state directory (swept at start-up)
PROBE_PREFIX = "restricted-probe-"


#: the checks the basic probe reports (its worker's own findings)
BASIC_CHECKS = ("socket_blocked", "write_outside_blocked", "unprivileged", "seccomp", "landlock",
                "pid_namespace")


async def run_probe(backend: RestrictedBackend) -> ProbeReport:
    """Run trusted probes in fully confined workers: socket blocked, write outside the
    workspace blocked, memory limit enforced, unprivileged (when root), seccomp active."""
    not_ready = await _not_ready(backend)
    if not_ready is not None:
        return not_ready
    # under the state directory (not /tmp): a daemon killed mid-probe leaves it where the
    # next start-up sweep finds it
    base = backend.config.state_dir / f"{PROBE_PREFIX}{secrets.token_hex(6)}"
    try:
        checks = await _checks(backend, base)
    finally:
        if backend.uids is not None:
            backend.uids.release(base.name)
        await asyncio.to_thread(fstree.remove_tree_quietly, base)
    ok = all(c.ok for c in checks)
    return ProbeReport(backend=BACKEND_NAME, ok=ok, checks=checks,
                       detail="" if ok else "confinement check failed")


async def _not_ready(backend: RestrictedBackend) -> ProbeReport | None:
    """The report of a backend that cannot be probed: unavailable, or its zygote does not
    answer a ping (then it is replaced)."""
    ok, reason = backend.availability()
    if not ok:
        return ProbeReport(backend=BACKEND_NAME, ok=False, detail=reason or "unavailable")
    z = backend.zygote
    if z is not None and z.alive and not await z.ping(health.PING_TIMEOUT_S):
        await backend.replace_zygote(z)
        return ProbeReport(backend=BACKEND_NAME, ok=False,
                           detail=f"the sandbox zygote (pid {z.pid}) did not answer a "
                           f"health ping within {health.PING_TIMEOUT_S:g} s; replaced")
    return None


async def _checks(backend: RestrictedBackend, base: Path) -> list[ProbeCheck]:
    """The probes' checks, run with a workspace under ``base`` (the caller removes it)."""
    base.mkdir(parents=True, mode=0o700)
    ws = base / "ws"
    ws.mkdir(mode=0o700)
    outside = base / f"outside-{secrets.token_hex(4)}"
    uid = backend.uids.acquire(base.name) if backend.uids is not None else None
    if uid is not None:
        os.chown(ws, uid, uid)
    lim = Limits(timeout_s=PROBE_DEADLINE_S, memory_bytes=64 * 1024 * 1024, output_bytes=65536)
    inv = Invocation(tool="python", client="probe", workspace=ws, arguments={"code": ""},
                     uid=uid, plan=ExecutionPlan(kind=ToolKind.python, limits=lim))
    checks = await _basic(backend, inv, outside)
    res, memory = await _memory(backend, inv)
    return [
        *checks,
        memory,
        ProbeCheck(name="cgroup", ok=bool(backend.layout.version) or not backend.root,
                   detail=backend.layout.detail or "not root: no cgroups"),
        ProbeCheck(name="cleanup", ok=res.cleanup.verified,
                   detail=res.cleanup.detail or "verified"),
    ]


async def _basic(backend: RestrictedBackend, inv: Invocation, outside: Path) -> list[ProbeCheck]:
    """The basic probe: the worker checks its own confinement (:data:`BASIC_CHECKS`); a write
    outside the workspace is also looked for here."""
    call = BackendCall(inv, time.monotonic() + PROBE_DEADLINE_S)
    msg = standby.request(call, "", probe="basic")
    msg = replace(msg, restricted=replace(
        msg.restricted, outside_path=str(outside), expect_unprivileged=backend.root,
        expect_namespaces=backend.namespaces, no_namespaces_reason=backend.no_namespaces))
    res, report = await backend.execute(WorkerCall(call, msg))
    found: dict[str, tuple[bool, str]] = (report.probe if report else None) or {}
    missing = (False, f"no result ({res.status.value}: {res.message})")
    checks = []
    for name in BASIC_CHECKS:
        ok, detail = found.get(name, missing)
        if name == "write_outside_blocked" and outside.exists():
            ok, detail = False, f"{outside} was written"
        checks.append(ProbeCheck(name=name, ok=bool(ok), detail=str(detail)))
    return checks


async def _memory(backend: RestrictedBackend, inv: Invocation) -> tuple[Result, ProbeCheck]:
    """The memory probe: the worker must be stopped by its memory limit."""
    call = BackendCall(inv, time.monotonic() + PROBE_DEADLINE_S)
    res, report = await backend.execute(
        WorkerCall(call, standby.request(call, "", probe="memory")))
    if res.termination.reason is not Reason.memory_limit:
        return res, ProbeCheck(name="memory_limit", ok=False,
                               detail=f"{res.status.value}/{res.termination.reason}: "
                               f"{res.message}")
    detail = ((report.probe if report else None) or {}).get(
        "memory_limit", (True, ""))[1] or "killed by the cgroup memory limit"
    return res, ProbeCheck(name="memory_limit", ok=True, detail=str(detail))
