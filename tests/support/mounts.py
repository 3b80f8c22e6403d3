"""Mounts a test may leave behind: find them, and detach them so that none outlives it."""

from __future__ import annotations

import ctypes
from pathlib import Path

MNT_DETACH = 2


def mounts_below(root: Path) -> list[str]:
    """Mount points below ``root`` in this (the daemon's) mount namespace."""
    prefix = str(root) + "/"
    with open("/proc/self/mountinfo") as fh:
        return [ln.split()[4] for ln in fh if ln.split()[4].startswith(prefix)]


def detach_below(root: Path) -> list[str]:
    """Detach every mount below ``root`` (deepest first); returns the ones that were there,
    for the test to assert there were none."""
    left = mounts_below(root)
    libc = ctypes.CDLL(None, use_errno=True)
    for point in sorted(left, key=len, reverse=True):
        libc.umount2(point.encode(), MNT_DETACH)
    return left
