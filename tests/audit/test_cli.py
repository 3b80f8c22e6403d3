"""`sandboxd audit verify` and `sandboxd audit tail`, run as real subprocesses."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from sandboxd.audit import AuditLog
from tests.support import cli
from tests.support.signals import default_signals


def sandboxd(*args: str) -> subprocess.CompletedProcess[str]:
    return cli.run(*args,
                   env={"PATH": "/usr/bin:/bin", "SANDBOXD_CONFIG": "/nonexistent"})


def fill(path: Path) -> None:
    with AuditLog(path) as log:
        log.write("startup", version="0.1.0")
        log.write("decision", request_id="r1", client="alice", tool="shell", decision="deny",
                  rule="tools.shell.commands.deny[0]", args_preview='{"command": "curl x"}')
        log.write("result", request_id="r2", client="bob", tool="python", status="ok",
                  termination={"reason": "exited", "exit_code": 0},
                  resources={"wall_ms": 12, "cpu_ms": 3, "peak_memory_bytes": 0})


def test_verify_ok_and_tampered(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    fill(log_path)
    r = sandboxd("audit", "verify", str(log_path))
    assert r.returncode == 0 and r.stdout.startswith("ok: 3 records in 1 file; head seq 2")
    log_path.write_text(log_path.read_text().replace('"client":"alice"', '"client":"eve"'))
    r = sandboxd("audit", "verify", str(log_path))
    assert r.returncode == 1
    assert r.stdout.startswith(f"FAILED: {log_path}:2 (seq 1): the record was altered")


def test_verify_missing_log(tmp_path: Path) -> None:
    r = sandboxd("audit", "verify", str(tmp_path / "nope.jsonl"))
    assert r.returncode == 1 and "no such audit log" in r.stdout


def test_tail_filters(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    fill(log_path)
    r = sandboxd("audit", "tail", str(log_path))
    out = r.stdout.splitlines()
    assert r.returncode == 0 and len(out) == 3
    assert "#1  decision" in out[1] and "client=alice" in out[1]
    assert "rule=tools.shell.commands.deny[0]" in out[1]
    assert 'args={"command": "curl x"}' in out[1]
    assert "reason=exited" in out[2] and "wall=12ms" in out[2]
    r = sandboxd("audit", "tail", "--client", "bob", str(log_path))
    assert len(r.stdout.splitlines()) == 1 and "tool=python" in r.stdout
    r = sandboxd("audit", "tail", "--status", "deny", str(log_path))
    assert len(r.stdout.splitlines()) == 1 and "client=alice" in r.stdout
    r = sandboxd("audit", "tail", "--tool", "python", "--status", "ok", "-n", "5", "--json",
                 str(log_path))
    assert r.stdout.count("\n") == 1 and '"status": "ok"' in r.stdout


def test_tail_follow_sees_new_records_and_rotation(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    fill(log_path)
    proc = subprocess.Popen([sys.executable, "-m", "sandboxd", "audit", "tail", "-f", "-n", "0",
                             "--event", "later", str(log_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"PATH": "/usr/bin:/bin", "SANDBOXD_CONFIG": "/nonexistent"},
                            preexec_fn=default_signals)
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("-- following")
        with AuditLog(log_path, max_bytes=1500) as log:
            for i in range(8):
                log.write("later", i=i, pad="p" * 200)
        assert proc.stdout is not None
        seen = [proc.stdout.readline() for _ in range(8)]
        assert all("later" in line for line in seen)
        assert [f"i={i}" in line for i, line in enumerate(seen)] == [True] * 8
        assert (tmp_path / "audit.jsonl.1").exists()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:  # never leave the follower behind
            proc.kill()
            proc.wait(10)


def test_verify_json(tmp_path: Path) -> None:
    import json

    log_path = tmp_path / "audit.jsonl"
    fill(log_path)
    r = sandboxd("audit", "verify", "--json", str(log_path))
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["ok"] and report["records"] == 3
    lines = log_path.read_text().splitlines()
    del lines[1]
    log_path.write_text("\n".join(lines) + "\n")
    r = sandboxd("audit", "verify", "--json", str(log_path))
    report = json.loads(r.stdout)
    assert r.returncode == 1 and report["first_bad"]["line"] == 2
    assert report["first_bad"]["seq"] == 2
