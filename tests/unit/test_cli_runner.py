"""The tests' CLI runner (:mod:`tests.support.cli`) is ``python -m sandboxd`` in a fresh
interpreter, as the tests that use it assume: same exit status and output, the environment,
working directory, temporary directory and standard input it is given, and nothing left
running after a timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support import cli

PROBE = "tests.support.cli_probe"
ENV = {"PATH": "/usr/bin:/bin", "SANDBOXD_CONFIG": "/nonexistent"}


def fresh(*args: str, env: dict[str, str], cwd: Path | None = None, input: str | None = None,
          module: str = "sandboxd") -> subprocess.CompletedProcess[str]:
    """``python -m module *args`` in a fresh interpreter (which finds the probe on
    PYTHONPATH; the server's children find it on the server's sys.path)."""
    if module == PROBE:
        env = {**env, "PYTHONPATH": str(cli.REPO)}
    return subprocess.run(cli.argv(module, args), capture_output=True, text=True, timeout=60,
                          env=env, cwd=cwd, input=input)


@pytest.mark.parametrize("args", [
    ("version",), ("audit", "--help"), ("nope",), ("audit", "verify", "/nonexistent"),
    ("policy", "check", "/nonexistent"), ("token", "list", "--tokens-file", "missing.yaml"),
], ids=" ".join)
def test_the_same_status_and_output_as_a_fresh_interpreter(args: tuple[str, ...],
                                                           tmp_path: Path) -> None:
    want = fresh(*args, env=ENV, cwd=tmp_path)
    got = cli.run(*args, env=ENV, cwd=tmp_path)
    assert (got.returncode, got.stdout, got.stderr) == \
        (want.returncode, want.stdout, want.stderr)
    assert got.args == [sys.executable, "-m", "sandboxd", *args]


@pytest.mark.parametrize(("exit_status", "settings", "ignored"), [
    ("0", {}, ()),
    ("3", {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"},
     (signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1)),
], ids=["plain", "settings-and-ignored-signals"])
def test_a_commands_process_is_a_fresh_interpreters(tmp_path: Path, exit_status: str,
                                                    settings: dict[str, str],
                                                    ignored: tuple[int, ...]) -> None:
    """Arguments, working directory, environment (and the TMPDIR in it), standard input and
    streams, signal dispositions (what the caller ignores stays ignored, as an exec keeps it:
    a CI job's background shell ignores SIGINT) and descriptors: as ``python -m`` gives
    them."""
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in ignored}
    try:
        _compare_with_a_fresh_interpreter(tmp_path, exit_status, settings)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _compare_with_a_fresh_interpreter(tmp_path: Path, exit_status: str,
                                      settings: dict[str, str]) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**ENV, "TMPDIR": str(scratch), "PROBE_EXIT": exit_status, **settings}
    assert cli.forkable(env)  # so this is the forked path
    args = ("one", "two words", "--three")
    want = fresh(*args, env=env, cwd=tmp_path, input="in\n", module=PROBE)
    got = cli.run(*args, env=env, cwd=tmp_path, input="in\n", module=PROBE)
    assert got.returncode == want.returncode == int(exit_status)
    assert got.stderr == want.stderr == "to stderr\n"
    found, expected = json.loads(got.stdout), json.loads(want.stdout)
    del expected["env"]["PYTHONPATH"]
    assert found == expected
    assert found["tmp"] == str(scratch) and found["stdin"] == "in\n"
    assert "SANDBOXD_TOKENS_FILE" not in found["env"]  # nothing of the server's own


def test_a_timeout_kills_the_command(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    log.write_text("")
    pids: list[int] = []
    real_kill = os.kill

    def watching_kill(pid: int, sig: int) -> None:
        pids.append(pid)
        real_kill(pid, sig)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "kill", watching_kill)
        with pytest.raises(subprocess.TimeoutExpired):
            cli.run("audit", "tail", "-f", str(log), env=ENV, timeout=1)
    (pid,) = pids
    assert not psutil.pid_exists(pid)  # killed and reaped before the exception


def test_other_interpreter_settings_get_a_fresh_interpreter(tmp_path: Path) -> None:
    """A ``sitecustomize`` on PYTHONPATH (the language-bypass harness of tests/security) runs
    at an interpreter's start: such a command is not forked."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nprint('site ran', file=sys.stderr)\n")
    env = {**ENV, "PYTHONPATH": str(tmp_path)}
    assert not cli.forkable(env)
    r = cli.run("version", env=env)
    assert r.returncode == 0 and r.stderr == "site ran\n", r.stderr
    with open(tmp_path / "log", "wb") as log:
        proc = cli.spawn("sandboxd", ["version"], env=env, stdout=log.fileno())
    assert isinstance(proc, subprocess.Popen) and proc.wait(60) == 0
    assert (tmp_path / "log").read_text().startswith("site ran\nsandboxd ")


def test_an_interrupted_command_ends_as_the_interpreter_ends_it(tmp_path: Path) -> None:
    """An uncaught KeyboardInterrupt: the traceback, then death by SIGINT (-2)."""
    env = {**ENV, "PROBE_EXIT": "interrupt"}
    want = fresh(env=env, cwd=tmp_path, module=PROBE)
    got = cli.run(env=env, cwd=tmp_path, module=PROBE)
    assert got.returncode == want.returncode == -signal.SIGINT
    assert got.stderr.endswith("KeyboardInterrupt\n") and want.stderr.endswith(
        "KeyboardInterrupt\n"), (got.stderr, want.stderr)
