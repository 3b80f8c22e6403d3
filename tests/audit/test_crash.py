"""A crash mid-write, a killed writer and a failing disk all leave a verifiable log."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from sandboxd.audit import AuditLog, rotated_files, verify
from tests.support.wait import wait_until


def test_torn_final_line_at_every_offset(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    with AuditLog(log_path) as log:
        for i in range(3):
            log.write("test", i=i)
    full = log_path.read_bytes()
    last_start = full.rstrip(b"\n").rfind(b"\n") + 1
    for cut in range(last_start + 1, len(full)):  # every torn version of the last record
        log_path.write_bytes(full[:cut])
        report = verify(log_path)
        assert report.ok, (cut, report.summary())
        assert report.records == 2
        assert len(report.warnings) == 1 and "incomplete final line" in report.warnings[0]
    # the daemon reopens the log: the torn bytes are cut off, the repair is recorded
    with AuditLog(log_path) as log:
        log.write("after")
    report = verify(log_path)
    assert report.ok and report.warnings == [] and report.records == 4
    events = [json.loads(line) for line in log_path.read_bytes().splitlines()]
    assert [e["event"] for e in events] == ["test", "test", "audit_repaired", "after"]
    assert events[2]["torn_bytes"] == len(full) - 1 - last_start
    assert events[2]["seq"] == 2


def test_torn_line_in_the_middle_is_an_error(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    with AuditLog(log_path) as log:
        for i in range(3):
            log.write("test", i=i)
    content = log_path.read_bytes().splitlines(keepends=True)
    content[1] = content[1][:10]  # torn, then more records after it
    log_path.write_bytes(b"".join(content))
    report = verify(log_path)
    assert not report.ok


WRITER = textwrap.dedent("""\
    import sys
    from pathlib import Path
    from sandboxd.audit import AuditLog
    log = AuditLog(Path(sys.argv[1]), max_bytes=int(sys.argv[2]))
    print("ready", flush=True)
    i = 0
    while True:
        log.write("spam", i=i, payload="x" * (i % 300))
        i += 1
""")


def test_writer_killed_with_sigkill_leaves_a_verifiable_log(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    for round_ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(log_path), "20000"],
                                stdout=subprocess.PIPE)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"
        # killed while it writes, once it has rotated again (the end asserts a rotation)
        rotated = len(rotated_files(log_path))
        try:
            wait_until(lambda rotated=rotated: len(rotated_files(log_path)) > rotated,
                       timeout=60, what=f"the writer's rotation in round {round_}")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            proc.stdout.close()
        report = verify(log_path)
        assert report.ok, report.summary()
        assert report.records > 10
    assert len(report.files) > 1  # it rotated while being killed


FULL_DISK = textwrap.dedent("""\
    import resource, signal, sys
    from pathlib import Path
    from sandboxd.audit import AuditError, AuditLog
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    log = AuditLog(Path(sys.argv[1]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (5000, 5000))
    n = 0
    try:
        while True:
            log.write("fill", n=n, payload="y" * 97)
            n += 1
    except AuditError as exc:
        print(n, exc, flush=True)
""")


def test_write_failure_raises_and_leaves_no_partial_record(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    r = subprocess.run([sys.executable, "-c", FULL_DISK, str(log_path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    written, message = r.stdout.splitlines()[0].split(" ", 1)
    assert "cannot write the audit log" in message
    assert log_path.read_bytes().endswith(b"\n")  # the partial record was removed
    report = verify(log_path)
    assert report.ok and report.warnings == []
    assert report.records == int(written)
