"""envd's directory watchers as the SDK's ``files.watch_dir`` polls them (``CreateWatcher``,
``GetWatcherEvents``, ``RemoveWatcher``): from the host, without a thread or a task. A
watcher is a snapshot of the watched directory (type, inode, size, mtime of each entry);
each poll takes a new one and answers the difference as envd's events (a new name CREATE, a
gone one REMOVE, a file whose size or mtime moved or that another was renamed over (how
the file tools write) WRITE, a gone name whose inode reappears
under another RENAME for the old name and CREATE for the new). So what happened between two
polls is coalesced (a file written then removed between them is not seen), and a watcher
costs nothing between polls: it ends with its sandbox's record, orphaning nothing.

The walk never follows a symlink (each directory opened ``O_NOFOLLOW`` under its parent's
descriptor, from the workspace root the workspace backend's walk opens), skips the
workspace's own ``.sandboxd-*`` files, and reports a name only when the one path
normalisation (:func:`sandboxd.protocol.rules.normalise_path`) accepts it: names are the
sandbox's, hostile. Bounds: :data:`MAX_WATCHERS` a sandbox, :data:`MAX_WATCH_ENTRIES`
entries a snapshot (so at most twice that many events a poll).
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from dataclasses import dataclass

from sandboxd.backends.workspace.files import MAX_LIST_ENTRIES, open_dir
from sandboxd.backends.workspace_errors import explain
from sandboxd.protocol import rules

MAX_WATCHERS = 8
"""Watchers one sandbox may hold at once."""
MAX_WATCH_ENTRIES = MAX_LIST_ENTRIES
"""Entries one watcher's snapshot may hold (the ``list_files`` bound)."""

#: relative name -> (kind, inode, size, mtime in ns)
Snapshot = dict[str, tuple[str, int, int, int]]


class WatchTooLarge(ValueError):
    """The watched directory holds more than :data:`MAX_WATCH_ENTRIES` entries."""


@dataclass
class Watcher:
    """One watcher: what it watches and what its last poll saw."""

    id: str
    path: str  # workspace-relative, normalised
    recursive: bool
    seen: Snapshot


def snapshot(root: str, path: str, recursive: bool) -> Snapshot:
    """The entries under ``path`` of the workspace at ``root`` (one level, or all)."""
    top = rules.normalise_path(path)
    try:
        fd = open_dir(root, rules.path_components(top))
    except OSError as exc:
        raise explain(exc, path) from None
    seen: Snapshot = {}
    stack = [(fd, "")]
    try:
        while stack:
            dfd, prefix = stack.pop()
            try:
                _scan(dfd, prefix, top, recursive, seen, stack)
            finally:
                os.close(dfd)
    finally:
        for dfd, _ in stack:
            os.close(dfd)
    return seen


#: the kinds of entry a snapshot tells apart, by the test of their mode ("other" else)
_KINDS = ((stat.S_ISDIR, "dir"), (stat.S_ISREG, "file"), (stat.S_ISLNK, "symlink"))


def _kind(mode: int) -> str:
    """An entry's kind in a snapshot: dir, file, symlink or other."""
    return next((kind for test, kind in _KINDS if test(mode)), "other")


def _scan(dfd: int, prefix: str, top: str, recursive: bool, seen: Snapshot,
          stack: list[tuple[int, str]]) -> None:
    with os.scandir(dfd) as it:
        for entry in it:
            name = prefix + entry.name
            if entry.name.startswith(".sandboxd-") or not _spellable(top, name):
                continue
            st = entry.stat(follow_symlinks=False)
            kind = _kind(st.st_mode)
            seen[name] = (kind, st.st_ino, st.st_size, st.st_mtime_ns)
            if len(seen) > MAX_WATCH_ENTRIES:
                raise WatchTooLarge(f"the watched directory holds more than {MAX_WATCH_ENTRIES}"
                                    " entries: watch a smaller one")
            if kind == "dir" and recursive:
                _descend(dfd, entry.name, name, stack)


def _spellable(top: str, name: str) -> bool:
    """Whether the project's paths can spell ``name`` under ``top`` (never reported else)."""
    try:
        rules.normalise_path(name if top == "." else f"{top}/{name}")
    except rules.PathRefused:
        return False
    return True


def _descend(dfd: int, entry: str, name: str, stack: list[tuple[int, str]]) -> None:
    """Queue the subdirectory ``entry`` of ``dfd`` for the walk, opened without following a
    symlink (one gone or replaced by a symlink since the scan is not walked)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    with contextlib.suppress(OSError):
        stack.append((os.open(entry, flags, dir_fd=dfd), name + "/"))


def changes(old: Snapshot, new: Snapshot) -> list[dict[str, str]]:
    """envd's events (``name`` relative to the watched directory) from ``old`` to ``new``."""
    created = {name for name in new if name not in old}
    events = [*_gone(old, new, created), *((name, "CREATE") for name in sorted(created)),
              *_altered(old, new)]
    return [{"name": name, "type": f"EVENT_TYPE_{kind}"} for name, kind in events]


def _gone(old: Snapshot, new: Snapshot, created: set[str]) -> list[tuple[str, str]]:
    """A name no longer there: RENAME when its inode reappears under a created name as the
    same kind, else REMOVE."""
    moved_to = {new[name][1]: name for name in created}
    events: list[tuple[str, str]] = []
    for name in sorted(set(old) - set(new)):
        target = moved_to.get(old[name][1])
        renamed = target is not None and new[target][0] == old[name][0]
        events.append((name, "RENAME" if renamed else "REMOVE"))
    return events


def _altered(old: Snapshot, new: Snapshot) -> list[tuple[str, str]]:
    """A name in both: REMOVE then CREATE when another kind replaced it, WRITE when a file's
    inode, size or mtime moved (written in place, or a new file renamed over it)."""
    events: list[tuple[str, str]] = []
    for name in sorted(set(old) & set(new)):
        before, after = old[name], new[name]
        if before[0] != after[0]:
            events.extend(((name, "REMOVE"), (name, "CREATE")))
        elif after[0] == "file" and before[1:] != after[1:]:
            events.append((name, "WRITE"))
    return events


def new_watcher(path: str, recursive: bool, seen: Snapshot) -> Watcher:
    return Watcher(id=uuid.uuid4().hex, path=path, recursive=recursive, seen=seen)
