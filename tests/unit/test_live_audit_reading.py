"""The tests' one reader of a live audit log leaves out an append in progress, nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.audit import audit_records


def test_a_prefix_of_an_append_in_progress_is_left_out(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    whole = [{"event": "decision", "seq": 1}, {"event": "result", "seq": 2}]
    log.write_text("".join(json.dumps(r) + "\n" for r in whole) + '{"ts":"2026","seq"')
    assert audit_records(log) == whole
    assert audit_records(log, "result") == whole[1:]


def test_a_complete_line_that_is_not_json_fails(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    log.write_text('{"event": "decision"}\nnot json\n')
    with pytest.raises(json.JSONDecodeError):
        audit_records(log)


def test_a_missing_log_has_no_records(tmp_path: Path) -> None:
    assert audit_records(tmp_path / "absent.jsonl") == []
