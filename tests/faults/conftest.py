"""Fault injection for real: small tmpfs mounts filled to the last byte (and freed again)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.ci import require


@pytest.fixture
def tmpfs() -> Iterator[Callable[[Path, str], Path]]:
    """``mount(path, size)``: a fresh tmpfs at ``path``; every mount is removed at the end."""
    mounted: list[Path] = []

    def mount(path: Path, size: str = "16m") -> Path:
        require(os.geteuid() == 0, "root (to mount a tmpfs)")
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                        str(path)], check=True)
        mounted.append(path)
        return path

    try:
        yield mount
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Write ``directory/filler`` until its filesystem has no byte left; returns the file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    block = b"\0" * 65536
    try:
        while True:
            try:
                os.write(fd, block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(block) == 1:
                    break
                block = block[: len(block) // 2]
    finally:
        os.close(fd)
    return filler

