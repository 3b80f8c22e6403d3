"""The fork operation of the service (see :mod:`sandboxd.fork`)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandboxd.errors import AuditFailure, Draining, StorageUnavailable
from sandboxd.fork.copy import Copied, copy_workspace
from sandboxd.host.storage import is_no_space

if TYPE_CHECKING:
    from sandboxd.service import Sandboxd
    from sandboxd.sessions.manager import Session

log = logging.getLogger("sandboxd")

#: forks one request may ask for (each is still counted against the client's sessions)
MAX_FORKS = 64
#: why a fork starts without its parent's Python state (the answer and the audit say it)
KERNEL_NOT_CARRIED = (
    "the Python state is not carried to forks: a confined kernel has dropped the privileges "
    "(a new uid, root and cgroup) a copy of its process would need to become a sandbox of its "
    "own; each fork starts a fresh kernel in its copied files at its first python call")


async def fork_session(service: Sandboxd, client: str, session_id: str, count: int, *,
                       transport: str = "http") -> dict[str, Any]:
    """``count`` forks of the client's session: their places are reserved (all or none)
    before the first await, each is made and filled with a copy of the parent's files before
    it is registered, and the fork is audited as one ``session_forked`` record (parent and
    children). All or nothing: a fork that fails removes those already made."""
    parent = service.sessions.get(session_id, client)
    if service.draining:
        raise Draining("the daemon is shutting down; fork the session once it is back")
    service.health.check_state_dir()
    places = service.sessions.reserve_places(client, count)
    children: list[Session] = []
    copied: list[Copied] = []
    try:
        service.capacity.admit_session()
        with service.sessions.in_use(parent):  # it does not expire under the copy
            kernels = service.kernel_backends(parent.id)

            async def fill(workspace: Path, uid: int | None) -> None:
                copied.append(await asyncio.to_thread(
                    copy_workspace, parent.workspace, str(workspace), owner=parent.uid,
                    uid=uid, max_bytes=parent.quota_bytes,
                    max_entries=parent.quota_entries or service.settings.session_quota_entries))

            for place in places:
                children.append(await service.sessions.create(
                    client, parent.ttl_s, place=place, fill=fill))
        await service.recorder.record(
            service.audit.write, event="session_forked", client=client, session=parent.id,
            children=[c.id for c in children], kernel_carried=False, transport=transport)
    except BaseException as exc:
        for place in places:
            place.release()
        for child in children:
            await asyncio.shield(service.sessions.drop(child))
        if isinstance(exc, OSError) and is_no_space(exc):
            raise StorageUnavailable(f"the session could not be forked: no space left "
                                     f"({exc.strerror or exc})") from exc
        if isinstance(exc, AuditFailure):
            log.error("session %s: fork undone, the audit log refused it: %s", parent.id, exc)
        raise
    views = [child.public(None) for child in children]
    return {"parent": parent.id, "sessions": views,
            "files": [{"bytes": c.bytes, "entries": c.entries, "skipped": c.skipped}
                      for c in copied],
            "kernel": {"carried": False, "parent_backends": kernels,
                       "reason": KERNEL_NOT_CARRIED}}
