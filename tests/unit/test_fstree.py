"""sandboxd.workspaces.fstree: measure, re-own and remove trees that sandboxed code wrote (hostile
trees must not break or redirect the daemon's own file work).

Deep (far past Python's recursion limit and PATH_MAX), wide, full of symlinks that lead out of
the tree, with unreadable directories: every walk is iterative, descriptor-based and bounded.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sandboxd.workspaces import fstree
from tests.support.ci import require


def chain(root: Path, depth: int, name: str = "d") -> None:
    """``depth`` nested directories below ``root`` (with descriptors: far past PATH_MAX)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(depth):
            os.mkdir(name, dir_fd=fd)
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
            if i % 1000 == 0:
                os.symlink("/", "up", dir_fd=fd)
                with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "w") as fh:
                    fh.write("x" * 5000)
    finally:
        os.close(fd)


def open_fds(under: Path) -> int:
    """Descriptors of this process that point into ``under`` (other threads of the test run
    may open and close unrelated ones meanwhile)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        n += target.startswith(str(under))
    return n


def test_deep_tree_is_measured_and_removed_without_recursion(tmp_path: Path) -> None:
    depth = max(sys.getrecursionlimit() * 5, 6000)
    root = tmp_path / "ws"
    root.mkdir()
    chain(root, depth)
    fds = open_fds(tmp_path)
    usage = fstree.measure(root, max_entries=10 * depth)
    assert usage.complete
    # every level is a directory, every 1000th has a file and a symlink
    assert usage.entries == depth + 2 * len(range(0, depth, 1000))
    assert usage.bytes >= 5000 * len(range(0, depth, 1000))
    assert open_fds(tmp_path) == fds, "the walk leaked descriptors"
    fstree.remove_tree(root)
    assert not root.exists()
    assert open_fds(tmp_path) == fds


def test_symlinks_are_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("precious")
    root = tmp_path / "ws"
    root.mkdir()
    (root / "to-outside").symlink_to(outside)
    (root / "to-file").symlink_to(outside / "keep")
    (root / "dir").mkdir()
    (root / "dir" / "deeper").symlink_to(outside)
    assert fstree.measure(root, max_entries=100).entries == 4
    fstree.chown_tree(root, os.getuid(), os.getgid())
    fstree.remove_tree(root)
    assert not root.exists()
    assert (outside / "keep").read_text() == "precious"


def test_measure_stops_at_its_entry_limit(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    for i in range(3000):
        (root / f"e{i}").touch()
    usage = fstree.measure(root, max_entries=1000)
    assert not usage.complete and usage.entries == 1001
    exact = fstree.measure(root, max_entries=3000)
    assert exact.complete and exact.entries == 3000 and exact.bytes == 0  # inodes, no bytes


def test_measure_stops_at_its_deadline(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    for i in range(2000):
        (root / f"e{i}").touch()
    usage = fstree.measure(root, max_entries=10_000, deadline_s=0)
    assert not usage.complete and usage.entries < 2000
    assert fstree.measure(root, max_entries=10_000, deadline_s=60).complete


def test_measure_and_chown_walk_the_same_entries(tmp_path: Path) -> None:
    """One walk: every entry measure counts is one chown_tree re-owns, and no other (deep,
    wide, with symlinks; ``os.chown`` is watched)."""
    root = tmp_path / "ws"
    root.mkdir()
    chain(root, 2500)
    for i in range(300):
        (root / f"w{i}").touch()
    (root / "sub").mkdir()
    (root / "sub" / "link").symlink_to("/etc")
    seen: list[str] = []
    real_chown = os.chown

    def watched(path: str, uid: int, gid: int, **kw: object) -> None:
        seen.append(path)
        real_chown(path, uid, gid, **kw)  # type: ignore[arg-type]

    fds = open_fds(tmp_path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fstree.os, "chown", watched)
        fstree.chown_tree(root, os.getuid(), os.getgid())
    assert len(seen) == fstree.measure(root, max_entries=10**6).entries == 2500 + 2 * 3 + 302
    assert open_fds(tmp_path) == fds
    fstree.remove_tree(root)  # (pytest's own clean-up of old test dirs recurses)


def test_unreadable_directories_are_removed(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_text("x")
    os.chmod(root / "a" / "b", 0)
    os.chmod(root / "a", 0)
    fstree.remove_tree(root)
    assert not root.exists()


def test_a_missing_tree_is_empty_and_removing_it_is_not_an_error(tmp_path: Path) -> None:
    assert fstree.measure(tmp_path / "nope", max_entries=10).entries == 0
    fstree.remove_tree(tmp_path / "nope")


def test_mount_points_inside_are_not_crossed(tmp_path: Path) -> None:
    import ctypes

    require(os.geteuid() == 0, "root (to mount a tmpfs inside the tree)")
    root = tmp_path / "ws"
    inner = root / "mnt"
    inner.mkdir(parents=True)
    libc = ctypes.CDLL(None, use_errno=True)
    mounted = libc.mount(b"none", str(inner).encode(), b"tmpfs", 0, b"size=64k") == 0
    require(mounted, f"mount(2) of a tmpfs ({os.strerror(ctypes.get_errno())})")
    try:
        (inner / "inside").write_text("x")
        assert fstree.measure(root, max_entries=10).entries == 1  # the mount point only
        with pytest.raises(fstree.TreeError):
            fstree.remove_tree(root)
        assert (inner / "inside").exists(), "the walk went into another filesystem"
    finally:
        libc.umount2(str(inner).encode(), 2)
    fstree.remove_tree(root)
    assert not root.exists()
