"""Audit retention (a log that only grows fills the disk): rotated files are deleted by count or
age, oldest first, and what is kept still verifies, anchored by an ``audit_pruned`` record in the
chain; deleting anything else is still detected."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from sandboxd.audit import AuditLog, read_records, rotated_files, verify
from tests.support import cli
from tests.support.daemon import running_daemon


def write(path: Path, n: int, **kwargs: object) -> None:
    with AuditLog(path, **kwargs) as log:  # type: ignore[arg-type]
        for i in range(n):
            log.write("test", i=i, client="alice")


def pruned(path: Path) -> list[dict]:
    return [r for r in read_records(path) if r["event"] == "audit_pruned"]


def test_without_retention_nothing_is_deleted(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    write(log_path, 60, max_bytes=400)
    assert len(rotated_files(log_path)) > 10 and not pruned(log_path)
    report = verify(log_path)
    assert report.ok and report.records == 60 and report.anchor_seq is None


def test_count_retention_keeps_the_newest_files_and_verifies(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    write(log_path, 60, max_bytes=400, retention_files=2)
    assert [p.name for p in rotated_files(log_path)] == ["audit.jsonl.2", "audit.jsonl.1"]
    report = verify(log_path)
    assert report.ok, report.summary()
    assert report.anchor_seq is not None and report.anchor_seq > 0
    assert "starts at seq" in report.summary()
    records = list(read_records(log_path))
    assert records[0]["seq"] == report.anchor_seq
    assert records[-1]["event"] == "test" and records[-1]["i"] == 59
    marks = pruned(log_path)
    assert marks and all(m["files"] for m in marks)
    last = marks[-1]
    assert last["anchor_seq"] == report.anchor_seq and last["removed_seqs"][1] == \
        report.anchor_seq - 1 and last["retention_files"] == 2
    # the CLI agrees
    out = cli.run("audit", "verify", "--json", str(log_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["anchor_seq"] == report.anchor_seq


def test_deleting_more_than_the_retention_did_is_still_detected(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    write(log_path, 60, max_bytes=400, retention_files=3)
    assert verify(log_path).ok
    rotated_files(log_path)[0].unlink()  # an attacker removes one more file
    bad = verify(log_path)
    assert not bad.ok and bad.first_bad is not None
    assert "does not start here" in bad.first_bad.reason


def test_an_edit_in_a_kept_file_is_still_detected(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    write(log_path, 60, max_bytes=400, retention_files=2)
    oldest = rotated_files(log_path)[0]
    content = oldest.read_bytes().replace(b'"client":"alice"', b'"client":"mallory"', 1)
    oldest.write_bytes(content)
    bad = verify(log_path)
    assert not bad.ok and bad.first_bad is not None and "altered" in bad.first_bad.reason


def test_keep_no_rotated_file(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    write(log_path, 30, max_bytes=400, retention_files=0)
    assert rotated_files(log_path) == []
    report = verify(log_path)
    assert report.ok and report.anchor_seq is not None, report.summary()
    first = next(read_records(log_path))
    assert first["event"] == "audit_pruned" and first["anchor_seq"] == first["seq"]


def test_age_retention_at_start_up(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    write(log_path, 40, max_bytes=400)
    files = rotated_files(log_path)
    old = time.time() - 3 * 86400
    for f in files[:-2]:  # all but the two newest rotated files are three days old
        os.utime(f, (old, old))
    write(log_path, 1, max_bytes=400, retention_days=1)
    kept = rotated_files(log_path)
    assert 2 <= len(kept) <= 3  # the two recent ones (and one more if writing rotated again)
    assert all(f.stat().st_mtime > time.time() - 86400 for f in kept)
    report = verify(log_path)
    assert report.ok, report.summary()
    assert pruned(log_path)[-1]["retention_days"] == 1


def test_retention_through_a_real_daemon(tmp_path: Path) -> None:
    env = {"SANDBOXD_AUDIT_MAX_BYTES": "4000", "SANDBOXD_AUDIT_RETENTION_FILES": "2"}
    with running_daemon(tmp_path, env=env) as d:
        for i in range(40):
            assert d.invoke("python", {"code": f"{i} * 2"}).json()["value"] == i * 2
    assert len(rotated_files(d.audit_path)) == 2
    assert pruned(d.audit_path)
    out = cli.run("audit", "verify", str(d.audit_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("ok: ") and "older records removed by retention" in out.stdout
