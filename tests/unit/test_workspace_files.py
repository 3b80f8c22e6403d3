"""File tools: paths are confined to the workspace, symlinks are never followed, sizes capped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandboxd.backends.workspace.files import (
    list_files,
    read_file,
    split_workspace_path,
    write_file,
)
from sandboxd.backends.workspace_errors import FileToolError, PathRefused


@pytest.mark.parametrize("raw", ["../x", "a/../../x", "/etc/passwd", "/workspace/../etc", "a\x00b"])
def test_refuses_escaping_paths(raw: str) -> None:
    with pytest.raises(PathRefused):
        split_workspace_path(raw)


def test_accepts_workspace_paths() -> None:
    assert split_workspace_path("a/./b//c.txt") == ["a", "b", "c.txt"]
    assert split_workspace_path("/workspace/notes.md") == ["notes.md"]
    assert split_workspace_path(".") == []


def test_write_read_list_roundtrip(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert write_file(root, "dir/sub/hello.txt", "héllo", 100, None, None) == 6
    assert read_file(root, "dir/sub/hello.txt", 100) == "héllo"
    assert list_files(root, "dir/sub") == [{"name": "hello.txt", "type": "file", "size": 6}]
    assert [e["name"] for e in list_files(root, ".")] == ["dir"]


def test_symlink_out_of_workspace_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("canary")
    ws = tmp_path / "ws"
    ws.mkdir()
    os.symlink(outside / "secret", ws / "link")
    os.symlink(outside, ws / "dirlink")
    with pytest.raises(PathRefused):
        read_file(str(ws), "link", 100)
    with pytest.raises(PathRefused):
        read_file(str(ws), "dirlink/secret", 100)
    with pytest.raises(PathRefused):
        write_file(str(ws), "dirlink/new", "x", 100, None, None)
    assert not (outside / "new").exists()
    # writing over the symlink replaces the link itself, never its target
    write_file(str(ws), "link", "mine", 100, None, None)
    assert (outside / "secret").read_text() == "canary"
    assert not (ws / "link").is_symlink()


def test_size_caps_and_special_files(tmp_path: Path) -> None:
    root = str(tmp_path)
    with pytest.raises(FileToolError, match="limit"):
        write_file(root, "big", "x" * 11, 10, None, None)
    with pytest.raises(FileToolError, match="quota"):
        write_file(root, "big", "x" * 5, 10, 4, None)
    (tmp_path / "large").write_bytes(b"y" * 50)
    with pytest.raises(FileToolError, match="50 bytes"):
        read_file(root, "large", 10)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(PathRefused, match="regular"):
        read_file(root, "fifo", 10)  # must not block
    with pytest.raises(FileToolError, match="does not exist"):
        read_file(root, "missing", 10)
