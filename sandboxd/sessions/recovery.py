"""A daemon's start: the sessions a previous daemon left on disk, recovered or removed.

The start-up half of :class:`~sandboxd.sessions.manager.SessionManager`, in a module of its
own because it reads what no running daemon wrote (metadata files, workspaces, mounts and uids
of a previous daemon, or of a crash) and trusts none of it: a session comes back only when its
metadata parses, it has not expired and its workspace checks out
(:func:`sandboxd.sessions.restarts.workspace_problem`); everything else below the workspaces
is removed, one failure at a time logged and reported, never stopping the sweep.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxd.host.uids import UidPoolExhausted, chown_tree
from sandboxd.sessions.record import Session
from sandboxd.sessions.restarts import workspace_problem
from sandboxd.workspaces.quota import mounts_below

if TYPE_CHECKING:
    from sandboxd.sessions.manager import SessionManager

log = logging.getLogger("sandboxd.sessions.manager")


def sweep(manager: SessionManager, now: float) -> dict[str, list[str]]:
    """Recover unexpired sessions from disk; delete expired ones, orphaned workspaces and
    temporary workspaces left by a crash (unmounting what is mounted). Blocks: the daemon
    runs it in a thread before it serves. One workspace that resists is logged and listed
    under ``failed``; it never stops the sweep. ``now``: the manager's clock. Returns what
    was recovered and removed."""
    for directory in (manager.root, manager.meta_dir):
        directory.mkdir(parents=True, exist_ok=True, mode=0o711)
        os.chmod(directory, 0o711)
    report: dict[str, list[str]] = {"recovered": [], "expired": [], "removed": [],
                                    "failed": []}
    manager.fs.detect(helper=True)
    for meta in manager.meta_dir.glob("*.json"):
        _recover(manager, meta, now, report)
    _remove_unowned(manager, report)
    return report


def _recover(manager: SessionManager, meta: Path, now: float,
             report: dict[str, list[str]]) -> None:
    """One session's metadata file: the session registered again, or ended and removed."""
    try:
        session = Session.load(meta.read_text())
    except (OSError, ValueError, TypeError):
        meta.unlink(missing_ok=True)
        report["removed"].append(meta.name)
        return
    workspace = manager.root / session.id
    alive = session.expires_at > now and workspace.is_dir()
    if alive:
        # a tmpfs gone with the mount namespace of the previous daemon, or anything
        # mounted, planted or chowned in its place while no daemon watched: the
        # session ends (never a silently empty or foreign workspace)
        why = workspace_problem(workspace, session.uid, tmpfs=manager.fs.kernel)
        if why is not None:
            alive = False
            manager.refused[session.id] = (session, why)
    if alive:
        session.workspace = str(workspace)
        session.node = manager.node_id  # it lives here, whatever its id says
        try:
            recover_identity(manager, session)
        except (OSError, UidPoolExhausted) as exc:
            log.error("sweep: session %s cannot be recovered: %s", session.id, exc)
            alive = False
    if alive:
        manager._sessions[session.id] = session
        report["recovered"].append(session.id)
    else:
        report["expired"].append(session.id)
        if not manager._remove_files(session.id):
            report["failed"].append(session.id)


def _remove_unowned(manager: SessionManager, report: dict[str, list[str]]) -> None:
    """Every mount and entry below the workspaces that no registered session owns (those of
    ended sessions, and the temporary workspaces of calls a crash cut)."""
    for point in mounts_below(manager.root):
        if point.parent == manager.root and point.name in manager._sessions:
            continue
        try:
            manager.fs.remove(point)
        except OSError as exc:
            log.error("sweep: could not remove the workspace %s: %s", point, exc)
            report["failed"].append(point.name)
    for entry in list(manager.root.iterdir()):
        if entry.name in manager._sessions:
            continue
        try:
            manager.fs.remove(entry)
            report["removed"].append(entry.name)
        except OSError as exc:
            log.error("sweep: could not remove the workspace %s: %s", entry, exc)
            report["failed"].append(entry.name)


def recover_identity(manager: SessionManager, session: Session) -> None:
    """A recovered session keeps its uid; one without a usable uid (metadata of an older
    daemon, or a uid outside today's range) gets a new one and its files follow."""
    if manager.uids is None:
        return
    if session.uid is not None and manager.uids.adopt(session.id, session.uid):
        return
    session.uid = manager.uids.acquire(session.id)
    chown_tree(Path(session.workspace), session.uid, session.uid)
    manager._save(session)
