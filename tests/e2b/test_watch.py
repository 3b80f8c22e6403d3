"""``files.watch_dir`` through the official SDK: the daemon's host-side watchers answer the
SDK's polls with envd's events for what happens in the workspace, never walk a symlink out
of it, and are bounded a sandbox."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2b.conftest import E2bDaemon
from tests.support.wait import wait_until

pytestmark = pytest.mark.docker


def _until(handle: Any, *wanted: tuple[str, str]) -> list[tuple[str, str]]:
    """Poll ``handle`` until every (name, type) of ``wanted`` was among its events."""
    seen: list[tuple[str, str]] = []

    def arrived() -> bool:
        seen.extend((e.name, e.type.name) for e in handle.get_new_events())
        return set(wanted) <= set(seen)

    wait_until(arrived, timeout=30, what=f"the events {wanted}", detail=lambda: str(seen))
    return seen


def test_watch_dir_reports_create_write_rename_and_remove(e2b_env: E2bDaemon) -> None:
    from e2b import Sandbox

    with Sandbox.create(template="base") as sbx:
        sbx.files.make_dir("/home/user/w")
        handle = sbx.files.watch_dir("/home/user/w", recursive=True)
        assert handle.get_new_events() == []
        sbx.files.write("/home/user/w/a.txt", "1")
        _until(handle, ("a.txt", "CREATE"))
        sbx.files.write("/home/user/w/a.txt", "22")
        _until(handle, ("a.txt", "WRITE"))
        sbx.files.rename("/home/user/w/a.txt", "/home/user/w/b.txt")
        _until(handle, ("a.txt", "RENAME"), ("b.txt", "CREATE"))
        sbx.files.write("/home/user/w/sub/c.txt", "3")  # recursive: a new directory's files
        _until(handle, ("sub", "CREATE"), ("sub/c.txt", "CREATE"))
        sbx.files.remove("/home/user/w/b.txt")
        _until(handle, ("b.txt", "REMOVE"))
        # a symlink the sandbox made is an entry, never a way out of the workspace
        sbx.files.write("/home/user/link.py", "import os\nos.symlink('/etc', 'w/out')\n")
        sbx.commands.run("python3 link.py")
        seen = _until(handle, ("out", "CREATE"))
        sbx.files.write("/home/user/w/last.txt", "4")
        seen += _until(handle, ("last.txt", "CREATE"))
        assert not [name for name, _ in seen if name.startswith("out/")], seen
        # not recursive: one level only
        flat = sbx.files.watch_dir("/home/user/w")
        sbx.files.write("/home/user/w/sub/d.txt", "5")
        sbx.files.write("/home/user/w/top.txt", "6")
        flat_seen = _until(flat, ("top.txt", "CREATE"))
        assert ("sub/d.txt", "CREATE") not in flat_seen
        handle.stop()
        flat.stop()


def test_watchers_are_bounded_a_sandbox_and_end_when_stopped(e2b_env: E2bDaemon) -> None:
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    from sandboxd.api.e2b.watch import MAX_WATCH_ENTRIES, MAX_WATCHERS

    with Sandbox.create(template="base") as sbx:
        with pytest.raises(SandboxException, match="outside"):
            sbx.files.watch_dir("/etc")
        handles = [sbx.files.watch_dir("/home/user") for _ in range(MAX_WATCHERS)]
        with pytest.raises(SandboxException, match=str(MAX_WATCHERS)):
            sbx.files.watch_dir("/home/user")
        handles[0].stop()
        sbx.files.watch_dir("/home/user")  # room again
        handles[0]._closed = False  # the SDK checks first; ask the daemon itself
        with pytest.raises(SandboxException, match="does not exist"):
            handles[0].get_new_events()
        # a directory over the entry bound: refused, never watched in part
        handles[1].stop()
        sbx.files.write("mk.py", f"import os\nos.makedirs('big')\n"
                        f"for i in range({MAX_WATCH_ENTRIES + 1}):\n"
                        f"    open(f'big/{{i}}', 'w').close()\n")
        sbx.commands.run("python3 mk.py")
        with pytest.raises(SandboxException, match=str(MAX_WATCH_ENTRIES)):
            sbx.files.watch_dir("/home/user/big")
