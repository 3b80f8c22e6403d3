"""The audit chain: every kind of tampering is detected and the first bad record named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandboxd.audit import GENESIS, AuditError, AuditLog, verify


def make_log(path: Path, n: int = 6, **kwargs: int) -> None:
    with AuditLog(path, **kwargs) as log:
        for i in range(n):
            log.write("test", i=i, client="alice")


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_clean_chain_verifies(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    make_log(log_path)
    report = verify(log_path)
    assert report.ok and report.records == 6 and report.head_seq == 5
    first = json.loads(lines(log_path)[0])
    assert first["seq"] == 0 and first["prev"] == GENESIS and first["event"] == "test"
    assert report.summary().startswith("ok: 6 records in 1 file; head seq 5 sha256 ")


def test_edit_is_detected(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    make_log(log_path)
    content = lines(log_path)
    content[2] = content[2].replace(b'"client":"alice"', b'"client":"mallory"')
    log_path.write_bytes(b"".join(content))
    report = verify(log_path)
    assert not report.ok and report.first_bad is not None
    assert (report.first_bad.line, report.first_bad.seq) == (3, 2)
    assert "altered" in report.first_bad.reason


def test_edit_of_prev_field_is_detected(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    make_log(log_path)
    content = lines(log_path)
    record = json.loads(content[4])
    record["prev"] = "f" * 64
    content[4] = json.dumps(record, separators=(",", ":")).encode() + b"\n"
    log_path.write_bytes(b"".join(content))
    report = verify(log_path)
    assert not report.ok and report.first_bad is not None
    assert report.first_bad.line in (4, 5)


def test_delete_is_detected(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    make_log(log_path)
    content = lines(log_path)
    del content[3]
    log_path.write_bytes(b"".join(content))
    report = verify(log_path)
    assert not report.ok and report.first_bad is not None
    assert (report.first_bad.line, report.first_bad.seq) == (4, 4)
    assert "seq jumps from 2 to 4: 1 record(s) removed" in report.first_bad.reason


def test_delete_of_the_head_is_detected(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    make_log(log_path)
    log_path.write_bytes(b"".join(lines(log_path)[2:]))
    report = verify(log_path)
    assert not report.ok and report.first_bad is not None
    assert report.first_bad.line == 1 and "does not start here" in report.first_bad.reason


def test_insert_is_detected(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    make_log(log_path)
    content = lines(log_path)
    # a forger who copies a record and even recomputes its prev still breaks the sequence
    forged = json.loads(content[2])
    forged["event"] = "forged"
    content.insert(3, json.dumps(forged, separators=(",", ":")).encode() + b"\n")
    log_path.write_bytes(b"".join(content))
    report = verify(log_path)
    assert not report.ok and report.first_bad is not None
    assert (report.first_bad.line, report.first_bad.seq) == (4, 2)
    assert "inserted or records were reordered" in report.first_bad.reason


def test_reorder_is_detected(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    make_log(log_path)
    content = lines(log_path)
    content[2], content[3] = content[3], content[2]
    log_path.write_bytes(b"".join(content))
    report = verify(log_path)
    assert not report.ok and report.first_bad is not None
    assert report.first_bad.line == 3 and report.first_bad.seq == 3
    assert "seq jumps from 1 to 3" in report.first_bad.reason


def test_garbage_line_is_detected(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    make_log(log_path)
    content = lines(log_path)
    content.insert(2, b"not json\n")
    log_path.write_bytes(b"".join(content))
    report = verify(log_path)
    assert not report.ok and report.first_bad is not None
    assert report.first_bad.line == 3 and "not a valid audit record" in report.first_bad.reason


def test_reopen_continues_the_chain(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    make_log(log_path, 3)
    with AuditLog(log_path) as log:
        assert log.seq == 2
        record = log.write("again")
    assert record["seq"] == 3
    assert verify(log_path).records == 4 and verify(log_path).ok


def test_rotation_keeps_the_chain_across_files(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    make_log(log_path, 20, max_bytes=400)
    files = sorted(p.name for p in tmp_path.iterdir() if p.name != "audit.jsonl.lock")
    assert len(files) > 3 and "audit.jsonl.1" in files
    assert all(p.stat().st_size <= 400 for p in tmp_path.iterdir())
    report = verify(log_path)
    assert report.ok and report.records == 20 and len(report.files) == len(files)
    # reopening after rotation continues from the newest rotated file when needed
    make_log(log_path, 2, max_bytes=400)
    assert verify(log_path).records == 22 and verify(log_path).ok
    # tampering in a rotated file is found there
    oldest = verify(log_path).files[0]
    content = lines(oldest)
    assert b'"i":0' in content[0]
    content[0] = content[0].replace(b'"i":0', b'"i":9')
    oldest.write_bytes(b"".join(content))
    bad = verify(log_path)
    assert not bad.ok and bad.first_bad is not None and bad.first_bad.file == oldest
    # removing a whole rotated file is found too
    oldest.unlink()
    bad = verify(log_path)
    assert not bad.ok and bad.first_bad is not None
    assert "does not start here" in bad.first_bad.reason


def test_second_writer_is_refused(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    with AuditLog(log_path), pytest.raises(AuditError, match="in use by another process"):
        AuditLog(log_path)


def test_unserialisable_record_writes_nothing(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    with AuditLog(log_path) as log:
        log.write("one")
        before = log_path.read_bytes()
        with pytest.raises(AuditError, match="not serialisable"):
            log.write("two", thing=object())
        with pytest.raises(AuditError, match="reserved"):
            log.write("three", seq=7)
        assert log_path.read_bytes() == before
        assert log.write("four")["seq"] == 1
    assert verify(log_path).ok


def test_closed_log_refuses_writes(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    log.close()
    with pytest.raises(AuditError, match="closed"):
        log.write("late")


def test_damaged_last_record_refuses_to_open(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    make_log(log_path, 2)
    log_path.write_bytes(log_path.read_bytes() + b"{garbage}\n")
    with pytest.raises(AuditError, match="not a valid audit record"):
        AuditLog(log_path)


def test_file_permissions(tmp_path: Path) -> None:
    log_path = tmp_path / "sub" / "audit.jsonl"
    make_log(log_path, 1)
    assert log_path.stat().st_mode & 0o777 == 0o600
