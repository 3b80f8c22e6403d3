"""Host-wide claims on sandbox uid ranges: no two daemons on one host share a sandbox uid.

A root daemon hands out uids from ``[sandbox_uid_first, sandbox_uid_first + sandbox_uid_count)``
(:mod:`sandboxd.host.uids`). At start-up it claims that range for its lifetime with a POSIX record
lock (``fcntl(F_SETLK)``) on the *bytes* ``[first, first + count)`` of one host-wide file,
:data:`LOCK_FILE`: two byte-range locks conflict exactly when the uid ranges overlap (identical
or not), the kernel names the holder's pid and range (``F_GETLK``), and it drops the lock when
the holder dies, SIGKILL included - no stale claim to clean up, nothing to remove at exit.

The directory is not ``/run/sandboxd`` on purpose: the unit's ``RuntimeDirectory=`` removes that
one when the service stops, and a claim held on a removed file would protect nothing.

A non-root daemon hands out no uids (its code keeps the daemon's uid), so it claims nothing.
Record locks belong to the process: they are not inherited by children, and closing *any*
descriptor of the file drops them, so a claiming process queries through its own descriptor.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from sandboxd.config import Settings
from sandboxd.errors import SandboxdError

LOCK_DIR = Path("/run/sandboxd-uids")
LOCK_FILE = LOCK_DIR / "ranges.lock"
#: where suggestions start: the setting's default (one definition, in sandboxd.config)
DEFAULT_FIRST: int = Settings.model_fields["sandbox_uid_first"].default
TOP = 65534  # suggestions stay below `nobody` (16-bit uids, container images)

_FLOCK = "hhqqi"  # struct flock on Linux LP64: l_type, l_whence, l_start, l_len, l_pid
_held: dict[Path, int] = {}  # this process's claims: lock file -> its descriptor


class UidRangeTaken(SandboxdError, RuntimeError):
    """Another live daemon on this host holds (part of) the configured sandbox uid range."""

    code = "uid-range-taken"


class UidClaimError(SandboxdError, RuntimeError):
    """The claim file cannot be created or locked."""

    code = "uid-claim-failed"


@dataclass(frozen=True)
class Holder:
    """A live claim that overlaps a range: its process and its range."""

    pid: int
    first: int
    count: int


def _open(path: Path) -> int:
    """A new descriptor of the claim file (callers close it; never one of a file this process
    claims in: closing any descriptor of it, even a dup, would drop the claim)."""
    try:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise UidClaimError(
            f"cannot open the uid claim file {path}: {exc.strerror} (a root-owned 0755 "
            f"directory {path.parent}; systemd-tmpfiles --create makes it)") from exc
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:  # anyone who can open it could take
        os.close(fd)  # a read lock on a range and keep every daemon of that range from starting
        raise UidClaimError(f"the uid claim file {path} must be owner-only ({oct(st.st_mode)}, "
                            f"uid {st.st_uid}): remove it or chmod 0600 it")
    return fd


def holder(first: int, count: int, path: Path = LOCK_FILE) -> Holder | None:
    """The live claim overlapping ``[first, first + count)``, or None when the range is free
    (as seen by another process: a process never conflicts with its own claim)."""
    own = _held.get(path)
    fd = own if own is not None else _open(path)
    try:
        req = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, first, count, 0)
        got = fcntl.fcntl(fd, fcntl.F_GETLK, req.ljust(64, b"\0"))
    finally:
        if own is None:
            os.close(fd)
    kind, _, start, length, pid = struct.unpack_from(_FLOCK, got)
    if kind == fcntl.F_UNLCK:
        return None
    return Holder(pid, start, length)


def free_range(count: int, start: int = DEFAULT_FIRST, path: Path = LOCK_FILE) -> int | None:
    """The lowest ``first >= start`` whose ``count`` uids no live daemon claims (below
    :data:`TOP`), or None. A hint: only :func:`claim` makes it yours."""
    first = start
    while first + count <= TOP:
        taken = holder(first, count, path)
        if taken is None:
            return first
        first = taken.first + taken.count if taken.count > 0 else TOP  # 0: to the end
    return None


def refusal(first: int, count: int, taken: Holder, path: Path = LOCK_FILE) -> str:
    """One line: which setting collides with which live daemon, and what to use instead."""
    free = free_range(count, first, path) or free_range(count, DEFAULT_FIRST, path)
    hint = (f"set sandbox_uid_first={free} (SANDBOXD_SANDBOX_UID_FIRST={free}), free for "
            f"{count} uids" if free is not None else "no free range of that size is left")
    return (f"sandbox uids {first}-{first + count - 1} (sandbox_uid_first={first}, "
            f"sandbox_uid_count={count}) overlap uids {taken.first}-"
            f"{taken.first + taken.count - 1} claimed by another sandboxd (pid {taken.pid}) "
            f"on this host: {hint}")


class UidClaim:
    """A held claim; :meth:`release` (or the process's death) drops it."""

    def __init__(self, first: int, count: int, path: Path, fd: int) -> None:
        self.first, self.count, self.path, self._fd = first, count, path, fd

    def release(self) -> None:
        if _held.get(self.path) == self._fd:
            del _held[self.path]
            os.close(self._fd)


def claim(first: int, count: int, path: Path = LOCK_FILE) -> UidClaim:
    """Claim ``[first, first + count)`` host-wide until :meth:`UidClaim.release` or exit;
    :class:`UidRangeTaken` (with :func:`refusal`'s message) when a live daemon holds part."""
    if path in _held:
        raise UidClaimError(f"this process already holds a uid claim in {path}")
    for _ in range(3):  # a holder that exits between our lock and our look: try again
        fd = _open(path)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, count, first, os.SEEK_SET)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                raise UidClaimError(f"cannot lock {path}: {exc.strerror}") from exc
            taken = holder(first, count, path)
            if taken is not None:
                raise UidRangeTaken(refusal(first, count, taken, path)) from None
            continue
        _held[path] = fd
        return UidClaim(first, count, path, fd)
    raise UidRangeTaken(refusal(first, count, Holder(0, first, count), path))


def claim_for(settings: Settings) -> UidClaim | None:
    """The daemon's claim on its configured range, or None when not root (no uid pool)."""
    if os.geteuid() != 0:
        return None
    return claim(settings.sandbox_uid_first, settings.sandbox_uid_count)


def claim_for_probes(settings: Settings, path: Path = LOCK_FILE,
                     ) -> tuple[Settings, UidClaim | None]:
    """For a short-lived user of sandbox uids beside live daemons (``sandboxd doctor``'s
    probes): the configured range when no daemon claims it, else the lowest free range of the
    same size, claimed either way (a daemon started meanwhile refuses it). The settings to
    probe with, and the claim to release (None when not root)."""
    if os.geteuid() != 0:
        return settings, None
    for _ in range(3):  # another claimant may take the free range between our look and lock
        try:
            held = claim(settings.sandbox_uid_first, settings.sandbox_uid_count, path)
            return settings, held
        except UidRangeTaken:
            first = free_range(settings.sandbox_uid_count, path=path)
            if first is None:
                raise
            settings = settings.model_copy(update={"sandbox_uid_first": first})
    raise UidRangeTaken(f"no free range of {settings.sandbox_uid_count} sandbox uids on this "
                        "host to probe with")


def main(argv: list[str] | None = None) -> int:
    """``python -m sandboxd.host.uidclaim COUNT [START]``: print a free range's first uid (for
    scripts: a second daemon beside a service)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m sandboxd.host.uidclaim",
                                     description="The first uid of a free sandbox uid range.")
    parser.add_argument("count", type=int, help="uids in the range (sandbox_uid_count)")
    parser.add_argument("start", type=int, nargs="?", default=DEFAULT_FIRST,
                        help=f"lowest first uid (default {DEFAULT_FIRST})")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("count must be at least 1")
    try:
        free = free_range(args.count, args.start)
    except UidClaimError as exc:
        parser.exit(1, f"{exc}\n")
    if free is None:
        parser.exit(1, f"no free range of {args.count} uids below {TOP}\n")
    print(free)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
