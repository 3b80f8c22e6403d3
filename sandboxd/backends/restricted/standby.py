"""One call on a standby worker: send it the request, read its frames until EOF, the wall
deadline, an output overflow or a protocol violation (then it is killed), and get its exit
report - from the zygote, or by reaping it here when the zygote hangs or is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import secrets
import time
from collections.abc import Awaitable
from typing import Any

from sandboxd.backends.base import CancelledAfterCleanup
from sandboxd.backends.call import BackendCall
from sandboxd.backends.restricted import health, outcome
from sandboxd.backends.restricted.cgroups import CgroupLayout
from sandboxd.backends.restricted.frames import FrameReader
from sandboxd.backends.restricted.worker_call import Exchange, WorkerCall
from sandboxd.backends.restricted.zygote_client import StandbyWorker, ZygoteDied, ZygoteHandle
from sandboxd.backends.restricted.zygote_protocol import HEADER, cgroup_limits
from sandboxd.models import Reason
from sandboxd.protocol.call import ProbeKind, RestrictedPart, WorkerRequest
from sandboxd.util.deadline import within


def kill_worker(z: ZygoteHandle, worker: StandbyWorker) -> None:
    """SIGKILL the worker through its pidfd, else ask the zygote to."""
    if not worker.kill():
        z.send(b"k", worker.pid)


async def abort(z: ZygoteHandle, worker: StandbyWorker, layout: CgroupLayout) -> dict[str, Any]:
    """Cancellation or a broken zygote: kill the worker, wait for it, clean its cgroup.
    Returns the zygote's exit report of the worker ({} when there is none)."""
    kill_worker(z, worker)
    if z.alive:
        with contextlib.suppress(Exception):
            info = await health.exit_report(z, worker)
            return info if info is not None else await health.reap_ourselves(worker, layout)
    # zygote gone: the worker dies by PDEATHSIG (and was killed above); prove it, and
    # remove its cgroup
    return await health.reap_ourselves(worker, layout)


async def exchange(
    z: ZygoteHandle, worker: StandbyWorker, wc: WorkerCall, layout: CgroupLayout
) -> Exchange:
    """Run the call ``wc`` on ``worker`` (taken from ``z``). On cancellation the worker is
    killed and reaped first, then :class:`CancelledAfterCleanup` is raised."""
    loop = asyncio.get_running_loop()
    msg, limits = wc.request, wc.limits
    reason: Reason | None = None
    exit_info: dict[str, Any] | None = None
    crashed: str | None = None
    z.took(worker, cgroup_limits(limits), probe=msg.restricted.probe is not None)
    reader = FrameReader(loop, worker.sock.fileno(), limits.output_bytes, limits.timeout_s,
                         display=msg.display, events=wc.invocation.events)
    z.in_use += 1
    try:
        await send(loop, worker, msg)
        finished, _ = await within(reader.done.wait(), wc.deadline - time.monotonic())
        if not finished:
            reason = Reason.wall_timeout
        if reader.violation is not None and reason is None:
            crashed = f"it broke the result protocol ({reader.violation}) and was killed"
        elif reader.overflow and reason is None:
            reason = Reason.output_limit
        if reason is not None or crashed is not None:
            kill_worker(z, worker)
        exit_info = await health.exit_report(z, worker)
        if exit_info is None:  # the zygote hangs: the daemon reaps the worker itself
            exit_info = await health.reap_ourselves(worker, layout)
    except asyncio.CancelledError:
        info = await asyncio.shield(abort(z, worker, layout))
        verified, detail = outcome.verify_gone(worker.pid, worker.cgroup, info, z.pid)
        raise CancelledAfterCleanup(verified, detail or "worker killed and reaped") from None
    except (ZygoteDied, OSError, TimeoutError) as exc:
        crashed = f"{type(exc).__name__}: {exc}"
        exit_info = await asyncio.shield(abort(z, worker, layout))
    finally:
        z.in_use -= 1
        reader.close()
        worker.close()
    return Exchange(reader, reason, crashed, exit_info)


def request(call: BackendCall, code: str, probe: ProbeKind | None = None) -> WorkerRequest:
    """The request a worker gets for one call, under the plan's limits (``probe``: a
    self-test instead of ``code``)."""
    inv, limits = call.invocation, call.limits
    remaining = max(0.05, call.deadline - time.monotonic())
    return WorkerRequest(
        kind="python", id=f"c{secrets.token_hex(8)}", code=code,
        imports_allow=inv.plan.imports_allow, imports_deny=inv.plan.imports_deny,
        limits=limits, display=inv.plan.display,
        restricted=RestrictedPart(workspace=str(inv.workspace), uid=inv.uid,
                                  cpu_seconds=math.ceil(remaining) + 1,
                                  max_file_bytes=int(inv.plan.max_file_bytes), probe=probe))


def send(loop: asyncio.AbstractEventLoop, worker: StandbyWorker,
         msg: WorkerRequest) -> Awaitable[None]:
    """Write ``msg`` to the worker's socket (length + JSON, :func:`.zygote_protocol.recv_msg`
    reads it)."""
    data = json.dumps(msg.to_wire()).encode()
    return loop.sock_sendall(worker.sock, HEADER.pack(len(data)) + data)
