"""The fork operation of the service (see :mod:`sandboxd.fork`)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandboxd.backends.capabilities import kernel_carrier
from sandboxd.errors import AuditFailure, Draining, StorageUnavailable
from sandboxd.fork.copy import Copied, copy_workspace
from sandboxd.host.storage import is_no_space

if TYPE_CHECKING:
    from sandboxd.service import Sandboxd
    from sandboxd.sessions.manager import Session
    from sandboxd.util.reservations import Reservation

log = logging.getLogger("sandboxd")

#: forks one request may ask for (each is still counted against the client's sessions)
MAX_FORKS = 64
#: why a fork starts without its parent's Python state on a backend that cannot carry it
KERNEL_NOT_CARRIED = (
    "the Python state is not carried to forks on this backend: a confined kernel has dropped "
    "the privileges (a new uid, root and cgroup) a copy of its process would need to become a "
    "sandbox of its own; each fork starts a fresh kernel in its copied files at its first "
    "python call")
#: why there is nothing to carry
NO_KERNEL = ("the session has no live Python kernel: there is no state to carry; each fork "
             "starts a fresh kernel at its first python call")
#: how long the parent's kernel may take to pickle its state
SNAPSHOT_TIMEOUT_S = 30.0


async def snapshot(service: Sandboxd, session_id: str,
                   kernels: list[str]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The answer's ``kernel`` part and the state each backend's forks restore: the parent's
    live kernels' state, pickled inside their sandboxes (opaque bytes here)."""
    deadline = asyncio.get_running_loop().time() + SNAPSHOT_TIMEOUT_S
    states: dict[str, bytes] = {}
    answer: dict[str, Any] = {"carried": False, "parent_backends": kernels,
                              "reason": NO_KERNEL}
    for name in kernels:
        carrier = kernel_carrier(service.backends[name])
        state = None if carrier is None else await carrier.snapshot_kernel(
            session_id, service.settings.fork_state_bytes, deadline)
        if state is None:
            answer["reason"] = KERNEL_NOT_CARRIED
            continue
        answer["not_carried"] = [{"name": n, "why": why}
                                 for n, why in sorted(state.not_carried.items())]
        if state.blob is None:
            answer["reason"] = f"the Python state is not carried: {state.reason}"
            continue
        states[name] = state.blob
        answer.update(carried=True, bytes=len(state.blob))
        answer.pop("reason", None)
    return answer, states


async def fork_session(service: Sandboxd, client: str, session_id: str, count: int, *,
                       transport: str = "http") -> dict[str, Any]:
    """``count`` forks of the client's session: their places are reserved (all or none)
    before the first await, each is made and filled with a copy of the parent's files before
    it is registered, and the fork is audited as one ``session_forked`` record (parent and
    children, whether the kernel's state is carried and the names left out). The parent's
    live kernel pickles its state inside its sandbox (:func:`snapshot`) while the forks are
    made; each fork's first kernel restores it inside its own. All or nothing: a fork that
    fails removes those already made (after the snapshot has ended: one cut short would end
    the parent's kernel), and no fork is given a state before all are made and audited."""
    parent = service.sessions.get(session_id, client)
    if service.draining:
        raise Draining("the daemon is shutting down; fork the session once it is back")
    service.health.check_state_dir()
    places = service.sessions.reserve_places(client, count)
    children: list[Session] = []
    copied: dict[str, Copied] = {}
    try:
        service.capacity.admit_session()
        with service.sessions.in_use(parent):  # it does not expire under the copy
            # the kernel pickles its state in its own process while the daemon's threads
            # copy the files: the two take the same order of time, on different cores
            snap = asyncio.ensure_future(
                snapshot(service, parent.id, service.kernel_backends(parent.id)))
            try:
                await _make(service, client, parent, places, copied, children)
            except BaseException:
                await asyncio.wait({snap})  # a snapshot is never cut: it ends the kernel
                if not snap.cancelled():
                    snap.exception()  # (its own failure is not the one raised)
                raise
            kernel, states = await snap
        await service.recorder.record(
            service.audit.write, event="session_forked", client=client, session=parent.id,
            children=[c.id for c in children], kernel_carried=kernel["carried"],
            not_carried=[n["name"] for n in kernel.get("not_carried", [])],
            state_bytes=kernel.get("bytes", 0), transport=transport)
    except BaseException as exc:
        await _undo(service, places, children, exc, parent.id)
        raise
    _seed(service, children, states)
    views = [child.public(None) for child in children]
    files = [copied[child.workspace] for child in children]
    return {"parent": parent.id, "sessions": views,
            "files": [{"bytes": c.bytes, "entries": c.entries, "skipped": c.skipped}
                      for c in files],
            "kernel": kernel}


async def _make(service: Sandboxd, client: str, parent: Session,
                places: list[Reservation[str]], copied: dict[str, Copied],
                children: list[Session]) -> None:
    """The forks, made at once (their copies run on the daemon's worker threads), added to
    ``children`` in the order of ``places``, each one's copy in ``copied`` by its workspace.
    When one fails, or the fork is cancelled, every other still ends (made or undone by
    :meth:`~sandboxd.sessions.manager.SessionManager.create`) before the first error is
    raised: those made are in ``children`` for the caller's undo."""

    async def fill(workspace: Path, uid: int | None) -> None:
        copied[str(workspace)] = await asyncio.to_thread(
            copy_workspace, parent.workspace, str(workspace), owner=parent.uid, uid=uid,
            max_bytes=parent.quota_bytes,
            max_entries=parent.quota_entries or service.settings.session_quota_entries)

    tasks = [asyncio.ensure_future(service.sessions.create(client, parent.ttl_s, place=place,
                                                           fill=fill))
             for place in places]
    try:
        await asyncio.wait(tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        raise
    finally:
        children += [t.result() for t in tasks
                     if t.done() and not t.cancelled() and t.exception() is None]
    errors = [asyncio.CancelledError("a fork's creation was cancelled") if t.cancelled()
              else t.exception() for t in tasks]
    failed = next((e for e in errors if e is not None), None)
    if failed is not None:
        raise failed


async def _undo(service: Sandboxd, places: list[Reservation[str]], children: list[Session],
                exc: BaseException, parent_id: str) -> None:
    """Undo a fork that failed: its places are released and the forks already made dropped;
    a full disk is raised as :class:`StorageUnavailable`, an audit refusal is logged."""
    for place in places:
        place.release()
    for child in children:
        await asyncio.shield(service.sessions.drop(child))
    if isinstance(exc, OSError) and is_no_space(exc):
        raise StorageUnavailable(f"the session could not be forked: no space left "
                                 f"({exc.strerror or exc})") from exc
    if isinstance(exc, AuditFailure):
        log.error("session %s: fork undone, the audit log refused it: %s", parent_id, exc)


def _seed(service: Sandboxd, children: list[Session], states: dict[str, bytes]) -> None:
    """Give each fork, made and audited, the parent's kernel state its first kernel restores."""
    for child in children:
        for name, blob in states.items():
            if (carrier := kernel_carrier(service.backends[name])) is not None:
                carrier.seed_kernel(child.id, blob)
