"""The files of an audit chain: the current file and its rotated ones, their tails, and the
directory fsync that makes a new or renamed file durable."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

GENESIS = "0" * 64


def rotated_files(path: Path) -> list[Path]:
    """The rotated files of ``path``, oldest first (``path.3``, ``path.2``, ``path.1``)."""
    found: list[tuple[int, Path]] = []
    try:
        for entry in path.parent.iterdir():
            suffix = entry.name[len(path.name) + 1:]
            if entry.name.startswith(path.name + ".") and suffix.isdigit():
                found.append((int(suffix), entry))
    except OSError:
        return []
    return [p for _, p in sorted(found, reverse=True)]


def chain_files(path: Path) -> list[Path]:
    """Every file of the chain, oldest first (rotated files, then ``path`` if it exists)."""
    base = path
    if path.suffix[1:].isdigit():  # given a rotated file: verify its whole chain
        base = path.with_suffix("")
    files = rotated_files(base)
    if base.exists():
        files.append(base)
    return files


@dataclass
class Tail:
    """The end of a log file: where its complete lines end, the last one, and a torn rest."""

    good_size: int  # size up to and including the last newline
    last_line: bytes | None  # the last complete line (without newline)
    torn: bytes  # bytes after the last newline (a torn write)


def read_tail(path: Path) -> Tail:
    """The end of ``path``, read backwards in growing blocks."""
    with path.open("rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return Tail(0, None, b"")
        block = 64 * 1024
        start = size
        data = b""
        while True:
            start = max(0, start - block)
            fh.seek(start)
            data = fh.read(size - start)
            if start == 0 or data.count(b"\n") >= 2:  # the last complete line is all here
                break
            block *= 2
        last_nl = data.rfind(b"\n")
        if last_nl < 0:
            return Tail(0, None, data)
        prev_nl = data.rfind(b"\n", 0, last_nl)
        return Tail(start + last_nl + 1, data[prev_nl + 1:last_nl], data[last_nl + 1:])


def first_line(path: Path) -> bytes | None:
    """The first complete line of a file (without newline), None if it has none."""
    try:
        with path.open("rb") as fh:
            line = fh.readline()
    except OSError:
        return None
    return line[:-1] if line.endswith(b"\n") else None


def fsync_dir(directory: Path) -> None:
    """fsync a directory (a created, renamed or removed entry is durable)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
