"""A session kernel's state for its forks, the daemon's side (the kernel's is
:mod:`.lang.carry`).

:func:`snapshot` asks the parent's live kernel, between its calls (under the session's lock),
to pickle its namespace: a request with ``snapshot`` and the byte limit, answered by one ``s``
frame (the state, read by the same bounded :class:`.frames.FrameReader` as any call, its
size within the limit) and a report naming what was left out. The bytes are opaque here:
the daemon never unpickles them, it hands them to each fork's first call
(:meth:`.kernel.KernelPool.seed`), whose fresh kernel restores them inside its own sandbox.

The snapshot is bounded like a call: the deadline (the kernel is interrupted, then ended if
it does not come back: the parent's state is then lost, and the answer says so), a protocol
violation (the kernel is ended), and the kernel must be proven parked again after it.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from typing import TYPE_CHECKING

from sandboxd.backends.base import KernelState
from sandboxd.backends.restricted import idle, standby
from sandboxd.backends.restricted.frames import FrameReader
from sandboxd.protocol.call import RestrictedPart, WorkerRequest
from sandboxd.util.deadline import within

if TYPE_CHECKING:
    from sandboxd.backends.restricted.kernel import KernelPool, SessionKernel


def _lost(why: str) -> KernelState:
    return KernelState(None, {}, f"{why}; the parent's kernel was ended (its state is lost: "
                                 "its next call starts a fresh one)")


async def snapshot(pool: KernelPool, sid: str, limit: int,
                   deadline: float) -> KernelState | None:
    """The pickled state of the session's live kernel (``None``: it has none); a hibernated
    kernel's is the state it was hibernated with (:mod:`.hibernation`)."""
    lock = pool.locks.setdefault(sid, asyncio.Lock())
    async with lock:
        asleep = await pool.hibernation.state(sid)
        if asleep is not None:
            return KernelState(asleep, {})
        k = pool.kernels.get(sid)
        if k is None or not k.alive:
            return None
        return await snapshot_locked(pool, sid, k, limit, deadline)


async def snapshot_locked(pool: KernelPool, sid: str, k: SessionKernel, limit: int,
                          deadline: float) -> KernelState:
    """:func:`snapshot` of the live kernel ``k``, the session's lock held by the caller."""
    from sandboxd.backends.restricted.kernel import cpu_seconds_used

    allow, deny = k.imports
    remaining = max(0.05, deadline - time.monotonic())
    msg = WorkerRequest(kind="python", id=f"s{secrets.token_hex(8)}", kernel=True,
                        snapshot=True, state_bytes=limit, limits=k.limits,
                        imports_allow=allow, imports_deny=deny,
                        restricted=RestrictedPart(cpu_seconds=math.ceil(remaining) + 1,
                                                  uid=k.uid, workspace=k.workspace))
    reader = FrameReader(asyncio.get_running_loop(), k.worker.sock.fileno(),
                         k.limits.output_bytes, remaining, until_report=True,
                         state_bytes=limit)
    k.zygote.in_use += 1
    try:
        k.cpu_s = cpu_seconds_used(k.worker.pid, k.uid)
        msg = pool._move_cpu_limit(k, msg)
        k.wake.clear()
        reader.on_stop = k.wake.set
        k.busy = True
        await standby.send(asyncio.get_running_loop(), k.worker, msg)
        return await _answer(pool, sid, k, reader, deadline)
    except asyncio.CancelledError:
        reader.close()
        await asyncio.shield(pool._stop(sid, k, "its snapshot was cancelled"))
        raise
    except (OSError, ValueError) as exc:
        reader.close()
        await pool._stop(sid, k, "its snapshot failed")
        return _lost(f"the snapshot failed ({type(exc).__name__}: {exc})")
    finally:
        k.zygote.in_use -= 1
        k.busy = False
        reader.close()


async def _answer(pool: KernelPool, sid: str, k: SessionKernel, reader: FrameReader,
                  deadline: float) -> KernelState:
    """Wait for the snapshot's end; keep the kernel only when it came back parked."""
    finished, _ = await within(k.wake.wait(), deadline - time.monotonic())
    if (not finished or not reader.done.is_set()) and not await pool._interrupt(k, reader):
        await pool._stop(sid, k, "its snapshot ran out of time")
        return _lost("the state was not pickled in time")
    report = reader.report
    broken = _broken(reader, k)
    if broken is not None or report is None:
        await pool._stop(sid, k, "its snapshot broke the protocol")
        return _lost(f"the snapshot failed: {broken or 'it ended without a report'}")
    busy = await idle.prove_idle(k.worker.pid, k.worker.fd, k.uid, deadline)
    if busy is not None:
        await pool._stop(sid, k, "it was not idle after its snapshot")
        return _lost(f"the kernel was not idle after its snapshot ({busy})")
    k.cpu_s = cpu_seconds_used_safe(k)
    not_carried = dict(report.not_carried or {})
    if reader.state is None:
        return KernelState(None, not_carried, report.error or report.message
                           or "the kernel sent no state")
    return KernelState(reader.state, not_carried)


def _broken(reader: FrameReader, k: SessionKernel) -> str | None:
    """How the kernel broke the snapshot's protocol: a violation, more than its output limit,
    or it ended (None: it did not)."""
    if reader.violation is None and not reader.overflow and not k.ended:
        return None
    return reader.violation or ("it wrote more than its output limit" if reader.overflow
                                else "it ended without a report")


def cpu_seconds_used_safe(k: SessionKernel) -> float:
    """The kernel's CPU seconds so far (its last known figure if it cannot be read)."""
    from sandboxd.backends.restricted.kernel import cpu_seconds_used

    try:
        return cpu_seconds_used(k.worker.pid, k.uid)
    except (OSError, ValueError):
        return k.cpu_s
