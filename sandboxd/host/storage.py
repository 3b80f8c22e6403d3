"""Free space: the one rule for "this filesystem is full" (state directory and audit log).

A filesystem counts as full when fewer than :data:`MIN_FREE_BYTES` are available to the daemon:
below that, a session's metadata, a workspace or an audit record may no longer fit, so the
daemon refuses new work (507) *before* anything runs, instead of failing half-way.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

#: below this many free bytes a filesystem is "full" for the daemon
MIN_FREE_BYTES = 256 * 1024

#: errnos that mean "no space" (a full disk or an exhausted quota)
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def free_bytes(path: Path) -> int | None:
    """Bytes available to an unprivileged writer on ``path``'s filesystem (None: unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def full_reason(path: Path, what: str) -> str | None:
    """Why ``path``'s filesystem counts as full (see :data:`MIN_FREE_BYTES`), else None."""
    free = free_bytes(path)
    if free is None or free >= MIN_FREE_BYTES:
        return None
    return (f"the {what} ({path}) is full: {free} bytes free, at least {MIN_FREE_BYTES} "
            "needed; the administrator must free space")


def is_no_space(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is a "no space left" error."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in NO_SPACE:
            return True
        seen = seen.__cause__ or seen.__context__
    return False
