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
from typing import TYPE_CHECKING

from sandboxd.backends.restricted import health, standby
from sandboxd.backends.restricted.outcome import BACKEND_NAME
from sandboxd.models import Invocation, Limits, ProbeCheck, ProbeReport, Reason
from sandboxd.protocol.plan import ExecutionPlan, ToolKind
from sandboxd.workspaces import fstree

if TYPE_CHECKING:
    from sandboxd.backends.restricted.backend import RestrictedBackend

#: deadline of each self-test probe: a bound that only a hung worker reaches (a slow or
#: emulated host takes seconds to fill the 64 MiB the memory probe needs)
PROBE_DEADLINE_S = 60.0
#: name prefix of the probes' directories under the state directory (swept at start-up)
PROBE_PREFIX = "restricted-probe-"


async def run_probe(backend: RestrictedBackend) -> ProbeReport:
    """Run trusted probes in fully confined workers: socket blocked, write outside the
    workspace blocked, memory limit enforced, unprivileged (when root), seccomp active."""
    checks: list[ProbeCheck] = []
    ok, reason = backend.availability()
    if not ok:
        return ProbeReport(backend=BACKEND_NAME, ok=False, detail=reason or "unavailable")
    z = backend.zygote
    if z is not None and z.alive and not await z.ping(health.PING_TIMEOUT_S):
        await backend.replace_zygote(z)
        return ProbeReport(backend=BACKEND_NAME, ok=False,
                           detail=f"the sandbox zygote (pid {z.pid}) did not answer a "
                           f"health ping within {health.PING_TIMEOUT_S:g} s; replaced")
    # under the state directory (not /tmp): a daemon killed mid-probe leaves it where the
    # next start-up sweep finds it
    base = backend.config.state_dir / f"{PROBE_PREFIX}{secrets.token_hex(6)}"
    try:
        base.mkdir(parents=True, mode=0o700)
        ws = base / "ws"
        ws.mkdir(mode=0o700)
        outside = base / f"outside-{secrets.token_hex(4)}"
        uid = backend.uids.acquire(base.name) if backend.uids is not None else None
        if uid is not None:
            os.chown(ws, uid, uid)
        lim = Limits(timeout_s=PROBE_DEADLINE_S, memory_bytes=64 * 1024 * 1024,
                     output_bytes=65536)
        inv = Invocation(tool="python", client="probe", workspace=ws, arguments={"code": ""},
                         uid=uid, plan=ExecutionPlan(kind=ToolKind.python, limits=lim))
        deadline = time.monotonic() + PROBE_DEADLINE_S
        msg = replace(standby.request(inv, lim, deadline, "", probe="basic"),
                      outside_path=str(outside), expect_unprivileged=backend.root,
                      expect_namespaces=backend.namespaces,
                      no_namespaces_reason=backend.no_namespaces)
        res, report = await backend.execute(inv, lim, deadline, msg)
        probe: dict[str, tuple[bool, str]] = (report.probe if report else None) or {}
        for name in (
            "socket_blocked",
            "write_outside_blocked",
            "unprivileged",
            "seccomp",
            "landlock",
            "pid_namespace",
        ):
            ok_, detail = probe.get(
                name, (False, f"no result ({res.status.value}: {res.message})")
            )
            if name == "write_outside_blocked" and outside.exists():
                ok_, detail = False, f"{outside} was written"
            checks.append(ProbeCheck(name=name, ok=bool(ok_), detail=str(detail)))
        msg = standby.request(inv, lim, time.monotonic() + PROBE_DEADLINE_S, "",
                            probe="memory")
        res, report = await backend.execute(inv, lim, time.monotonic() + PROBE_DEADLINE_S,
                                            msg)
        if res.termination.reason is Reason.memory_limit:
            detail = ((report.probe if report else None) or {}).get(
                "memory_limit", (True, ""))[1] or "killed by the cgroup memory limit"
            checks.append(ProbeCheck(name="memory_limit", ok=True, detail=str(detail)))
        else:
            checks.append(
                ProbeCheck(
                    name="memory_limit",
                    ok=False,
                    detail=f"{res.status.value}/{res.termination.reason}: {res.message}",
                )
            )
        checks.append(
            ProbeCheck(
                name="cgroup",
                ok=bool(backend.layout.version) or not backend.root,
                detail=backend.layout.detail or "not root: no cgroups",
            )
        )
        checks.append(
            ProbeCheck(
                name="cleanup", ok=res.cleanup.verified, detail=res.cleanup.detail or "verified"
            )
        )
    finally:
        if backend.uids is not None:
            backend.uids.release(base.name)
        await asyncio.to_thread(fstree.remove_tree_quietly, base)
    return ProbeReport(
        backend=BACKEND_NAME,
        ok=all(c.ok for c in checks),
        checks=checks,
        detail="" if all(c.ok for c in checks) else "confinement check failed",
    )
