"""``audit tail -f`` across rotations (``sandboxd.audit.reader.follow``): a rotation's names
shift (``.1`` is always the newest rotated file), so the follower finds the file written after
its own by inode, from a listing that two passes agree on. Here the log rotates again while the
follower is listing the chain, the race that once made it skip a file and wait forever."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from sandboxd.audit import AuditLog, reader
from tests.support.wait import wait_until

#: records of ~300 bytes in files of at most 1,500: a rotation every few records
MAX_BYTES = 1500
PAD = "p" * 200
#: a hang is what this catches: a follower that skipped a file waits for records forever
JOIN_S = 30


def write_later(log: AuditLog, numbers: range) -> None:
    for i in numbers:
        log.write("later", i=i, pad=PAD)


def collect(follower: Any, last: int) -> tuple[list[int], threading.Thread]:
    """Consume ``follower`` in a thread until the 'later' record ``last`` came."""
    seen: list[int] = []

    def run() -> None:
        for record in follower:
            if record.get("event") == "later":
                seen.append(record["i"])
                if record["i"] == last:
                    return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return seen, thread


def test_rotation_while_the_follower_lists_the_chain(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "audit.jsonl"
    real_chain_files = reader.chain_files
    listings = 0
    with AuditLog(path, max_bytes=MAX_BYTES) as log:
        log.write("earlier")

        def chain_files_then_rotate(p: Path) -> list[Path]:
            nonlocal listings
            listings += 1
            files = real_chain_files(p)
            if listings == 1:  # the names shift under the follower's first listing
                write_later(log, range(6, 12))
            return files

        monkeypatch.setattr(reader, "chain_files", chain_files_then_rotate)
        follower = reader.follow(path, interval_s=0.01)  # the position is taken here
        write_later(log, range(6))  # rotates before the follower's first look
        seen, thread = collect(follower, 11)
        thread.join(JOIN_S)
    assert seen == list(range(12)), f"records seen: {seen}"
    assert listings >= 3, "the listing under rotation was taken again until two agreed"
    assert (tmp_path / "audit.jsonl.2").exists(), "the log rotated at least twice"


def test_follower_steps_through_several_rotations_between_polls(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, max_bytes=MAX_BYTES) as log:
        log.write("earlier")
        follower = reader.follow(path, interval_s=0.01)
        write_later(log, range(20))  # several rotations before the first poll
        seen, thread = collect(follower, 24)
        wait_until(lambda: len(seen) >= 20, timeout=JOIN_S, what="the rotated files' records",
                   detail=lambda: seen)
        assert seen == list(range(20))
        write_later(log, range(20, 25))  # and it goes on tailing the current file
        thread.join(JOIN_S)
    assert seen == list(range(25)), f"records seen: {seen}"
    assert len(list(tmp_path.glob("audit.jsonl.*"))) >= 4


def test_pruned_files_resume_at_the_current_one(tmp_path: Path) -> None:
    """Retention removed the files after the one the follower held: it reads the rest of its
    own (still open), then goes on with the current file instead of waiting for lost ones."""
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, max_bytes=MAX_BYTES, retention_files=1) as log:
        log.write("earlier")
        follower = reader.follow(path, interval_s=0.01)
        write_later(log, range(20))  # the held file is pruned long before the first poll
        seen, thread = collect(follower, 19)
        thread.join(JOIN_S)
    assert seen[:1] == [0] and seen[-1:] == [19], f"records seen: {seen}"
    assert seen == sorted(set(seen)) and len(seen) < 20, f"records seen: {seen}"
