"""The container backend's self-test: probes run as real one-shot calls that prove its
confinement (unprivileged, no network, read-only system, seccomp, no_new_privs, memory limit,
cleanup)."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandboxd.backends.container.oneshot import PROBE_CLIENT
from sandboxd.models import (
    Invocation,
    Limits,
    ProbeCheck,
    ProbeReport,
    Reason,
    Result,
)
from sandboxd.protocol.plan import ExecutionPlan, ToolKind
from sandboxd.workspaces import fstree

if TYPE_CHECKING:
    from sandboxd.backends.container.backend import ContainerBackend


def _confinement_checks(backend: ContainerBackend, facts: dict[str, Any]) -> list[ProbeCheck]:
    """What the probe call saw from inside its container, checked: an unprivileged uid of the
    sandbox's own, no network, no write outside the workspace, seccomp, no_new_privs."""
    uid = facts.get("uid")
    own = (backend.uids.contains(uid) if backend.uids is not None and isinstance(uid, int)
           else uid == backend.config.sandbox_uid)
    return [
        ProbeCheck(name="unprivileged",
                   ok=bool(own) and uid != 0 and facts.get("cap_eff") == 0,
                   detail=f"uid={facts.get('uid')} CapEff={facts.get('cap_eff')}"),
        ProbeCheck(name="socket_blocked", ok=bool(facts.get("net_blocked")),
                   detail=str(facts.get("net_detail"))),
        ProbeCheck(name="write_outside_blocked", ok=bool(facts.get("write_blocked")),
                   detail=str(facts.get("write_detail"))),
        ProbeCheck(name="seccomp",
                   ok=facts.get("seccomp") == 2 and bool(facts.get("unshare_blocked")),
                   detail=f"Seccomp={facts.get('seccomp')} unshare blocked="
                          f"{facts.get('unshare_blocked')}"),
        ProbeCheck(name="no_new_privs", ok=facts.get("no_new_privs") == 1,
                   detail=f"NoNewPrivs={facts.get('no_new_privs')}"),
    ]


async def run_probe(backend: ContainerBackend) -> ProbeReport:
    """Run the probes through ``backend`` and report each check."""
    checks: list[ProbeCheck] = []
    workspace = Path(tempfile.mkdtemp(prefix="probe-", dir=backend.config.state_dir))
    try:
        # the daemon's own probe code: every import admitted (the runner's rule is default
        # deny, as for a policy's call)
        wall_s = backend.config.probe_call_timeout_s
        limits = Limits(timeout_s=wall_s)
        inv = Invocation(tool="python", client=PROBE_CLIENT, workspace=workspace,
                         arguments={"code": PROBE_CODE},
                         plan=ExecutionPlan(kind=ToolKind.python, limits=limits,
                                            imports_allow=("*",)))
        res = await backend.run(inv, time.monotonic() + wall_s)
        facts = res.value if isinstance(res.value, dict) else {}
        if not facts:
            detail = f"probe failed: {res.status} {res.message or ''} {res.stderr[-300:]}"
            return ProbeReport(backend=backend.name, ok=False, detail=detail)
        checks.extend(_confinement_checks(backend, facts))
        mem_limits = Limits(timeout_s=wall_s, memory_bytes=48 * 1024 * 1024)
        mem_inv = Invocation(tool="python", client=PROBE_CLIENT, workspace=workspace,
                             arguments={"code": "x = bytearray(96 * 1024 * 1024)\n"
                                                "x[::4096] = b'x' * len(x[::4096])\n"},
                             plan=ExecutionPlan(kind=ToolKind.python, limits=mem_limits,
                                                imports_allow=("*",)))
        mem = await backend.run(mem_inv, time.monotonic() + wall_s)
        checks.append(ProbeCheck(
            name="memory_limit", ok=mem.termination.reason is Reason.memory_limit,
            detail=f"96 MiB under a 48 MiB limit -> {_how_it_ended(mem)}"))
        checks.append(ProbeCheck(name="cleanup", ok=res.cleanup.verified
                                 and mem.cleanup.verified,
                                 detail="probe containers removed"))
    finally:
        await asyncio.to_thread(fstree.remove_tree_quietly, workspace)
    return ProbeReport(backend=backend.name, ok=all(c.ok for c in checks), checks=checks)


def _how_it_ended(result: Result) -> str:
    """The reason, and when it is not the expected limit, everything that says why."""
    end = result.termination
    if end.reason is Reason.memory_limit:
        return end.reason.value
    said = f"{end.reason.value}: status {result.status.value}, exit code {end.exit_code}, " \
           f"signal {end.signal}, peak {result.resources.peak_memory_bytes >> 20} MiB"
    if result.message:
        said += f", {result.message}"
    tail = (result.stderr or result.stdout)[-300:].strip()
    return f"{said}; output: {tail}" if tail else said


PROBE_CODE = r"""
import ctypes, os, socket
facts = {"uid": os.getuid()}
with open("/proc/self/status") as fh:
    status = dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)
facts["cap_eff"] = int(status.get("CapEff", "-1"), 16)
facts["seccomp"] = int(status.get("Seccomp", "0").strip())
facts["no_new_privs"] = int(status.get("NoNewPrivs", "0").strip())
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect(("1.1.1.1", 53))
    facts["net_blocked"], facts["net_detail"] = False, "connected to 1.1.1.1:53"
except OSError as exc:
    facts["net_blocked"], facts["net_detail"] = True, f"connect: {exc}"
blocked = []
for path in ("/probe", "/etc/probe", "/usr/probe", "/run/sandboxd/probe"):
    try:
        with open(path, "w") as fh:
            fh.write("x")
        blocked.append(False)
    except OSError:
        blocked.append(True)
facts["write_blocked"] = all(blocked)
facts["write_detail"] = "writes to /, /etc, /usr, /run/sandboxd refused" if all(blocked) else (
    f"some writes succeeded: {blocked}")
libc = ctypes.CDLL(None, use_errno=True)
facts["unshare_blocked"] = libc.unshare(0x10000000) != 0
facts
"""
