"""Admin commands find the state, audit log and policies of the daemon they are pointed at
(`--state-dir`, `--config`), resolved exactly as `serve` resolves them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support import cli
from tests.support.daemon import running_daemon


def sandboxd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return cli.run(*args, timeout=180,
                   env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                        "SANDBOXD_CONFIG": os.devnull, **(env or {})})


def test_audit_commands_follow_state_dir_and_config(tmp_path: Path) -> None:
    state = tmp_path / "daemon-state"
    with running_daemon(tmp_path, state_dir=state) as d:
        r = d.invoke("python", {"code": "print('followed')"})
        assert r.status_code == 200 and r.json()["status"] == "ok"
    verify = sandboxd("audit", "verify", "--state-dir", str(state))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert str(state / "audit.jsonl") in verify.stdout
    tail = sandboxd("audit", "tail", "--state-dir", str(state), "--tool", "python")
    assert tail.returncode == 0 and "python" in tail.stdout
    # the same through a config file, as the systemd unit's /etc/sandboxd/sandboxd.yaml
    config = tmp_path / "sandboxd.yaml"
    config.write_text(f"state_dir: {state}\n")
    via_config = sandboxd("audit", "verify", "--config", str(config))
    assert via_config.returncode == 0 and str(state / "audit.jsonl") in via_config.stdout
    via_env = sandboxd("audit", "verify", env={"SANDBOXD_CONFIG": str(config)})
    assert via_env.returncode == 0 and str(state / "audit.jsonl") in via_env.stdout
    # a config file that does not exist or is broken: one line, exit 2
    missing = sandboxd("audit", "verify", "--config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "nope.yaml" in missing.stderr
    config.write_text("state_dir: [1, 2\n")
    broken = sandboxd("audit", "tail", "--config", str(config))
    assert broken.returncode == 2 and broken.stderr.count("\n") == 1


def test_doctor_follows_state_dir_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "not-yet"
    scratch = tmp_path / "tmp"  # its own TMPDIR: other test workers run doctors in /tmp
    scratch.mkdir()
    r = sandboxd("doctor", "--state-dir", str(missing), "-b", "restricted",
                 env={"TMPDIR": str(scratch)})
    assert r.returncode == 0, r.stdout + r.stderr
    row = next(line for line in r.stdout.splitlines() if " state_dir " in line)
    assert str(missing) in row and "does not exist yet" in row
    audit_row = next(line for line in r.stdout.splitlines() if " audit_log " in line)
    assert str(missing / "audit.jsonl") in audit_row and "not written yet" in audit_row
    assert not missing.exists()
    assert list(scratch.iterdir()) == []
