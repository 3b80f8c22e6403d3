"""The daemon-facing CLI commands: serve's refusals, tools, invoke, version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import cli
from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, refused_port, uid_range_env
from tests.support.wait import wait_until


@pytest.fixture
def daemon(module_daemon: RunningDaemon) -> RunningDaemon:
    """This module's tests share one daemon (tests/conftest.py: module_daemon)."""
    return module_daemon


def sandboxd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return cli.run(*args, env=env)


def test_serve_refuses_public_bind_without_tokens(tmp_path: Path) -> None:
    r = sandboxd("serve", "--host", "0.0.0.0", "--state-dir", str(tmp_path))
    assert r.returncode != 0
    assert "non-loopback" in r.stderr and "token" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "audit.jsonl").exists()  # refused before anything started


def test_version() -> None:
    r = sandboxd("version")
    assert r.returncode == 0 and r.stdout.startswith("sandboxd ")


def test_tools_and_invoke(daemon: RunningDaemon) -> None:
    r = sandboxd("tools", "--url", daemon.url)
    assert r.returncode == 0, r.stderr
    assert any(line.startswith("python") for line in r.stdout.splitlines())
    r = sandboxd("tools", "--openai", "--url", daemon.url)
    assert json.loads(r.stdout)[0]["type"] == "function"
    r = sandboxd("invoke", "python", "--arg", "code=print(6*7)", "--url", daemon.url)
    assert (r.returncode, r.stdout) == (0, "42\n"), r.stderr
    r = sandboxd("invoke", "python", "--json", '{"code": "1/0"}', "--url", daemon.url)
    assert r.returncode == 1
    assert "ZeroDivisionError" in r.stderr
    r = sandboxd("invoke", "python", "--json", "[1]", "--url", daemon.url)
    assert r.returncode == 2 and "JSON object" in r.stderr
    r = sandboxd("invoke", "nope", "--url", daemon.url)
    assert r.returncode == 1 and "HTTP 404" in r.stderr


def test_invoke_says_every_status_and_exits_by_it(daemon: RunningDaemon) -> None:
    """Exit 0 ok, 1 error, 2 denied/rejected, 3 timeout/killed; a status line on stderr for
    every result but ok (a denied call or a timeout printed nothing and exited 1)."""
    cases = [
        (["--arg", "code=print(1)"], 0, None),
        (["--arg", "code=1/0"], 1, "[error]"),
        (["--arg", "code=import socket"], 2, "[denied]"),
        (["--arg", "code=while True: pass", "--timeout", "1"], 3, "[timeout]"),
    ]
    for args, code, line in cases:
        r = sandboxd("invoke", "python", *args, "--url", daemon.url)
        assert r.returncode == code, (args, r.returncode, r.stderr)
        if line is None:
            assert r.stderr == "", r.stderr
        else:
            status = [x for x in r.stderr.splitlines() if x.startswith("[")]
            assert len(status) == 1 and status[0].startswith(line), r.stderr
            assert len(status[0]) > len(line) + 1, r.stderr  # and a message after it


def test_invoke_reports_unreachable_daemon() -> None:
    with refused_port() as port:
        r = sandboxd("invoke", "python", "--arg", "code=1", "--url", f"http://127.0.0.1:{port}")
    assert r.returncode == 1
    assert "cannot reach the daemon" in r.stderr and "Traceback" not in r.stderr


def test_serve_on_unix_socket(tmp_path: Path) -> None:
    import stat

    sock = tmp_path / "run" / "sandboxd.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandboxd", "serve", "--uds", str(sock),
         "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **uid_range_env()})
    try:
        wait_until(lambda: sock.exists() or proc.poll() is not None, timeout=60,
                   what="the daemon's socket")
        assert sock.exists(), proc.stdout.read() if proc.poll() is not None else "no socket"

        # the socket is bound owner-only (umask 077) and opened to the group once start-up
        # is done: wait for that, never for a fixed time
        def opened_to_the_group() -> bool:
            mode = stat.S_IMODE(os.stat(sock).st_mode)
            assert proc.poll() is None, oct(mode)
            assert mode & 0o007 == 0, f"others may use the socket: {oct(mode)}"
            return mode == 0o660

        wait_until(opened_to_the_group, timeout=60, what="the socket opened to the group")
        r = sandboxd("invoke", "python", "--arg", "code=print(7*6)", "--url", f"unix:{sock}")
        assert (r.returncode, r.stdout) == (0, "42\n"), r.stderr
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    assert not sock.exists()  # removed on shutdown


def test_serve_on_a_port_in_use_has_its_own_exit_status(daemon: RunningDaemon,
                                                        tmp_path: Path) -> None:
    """A second daemon on the same port: one line naming the address, exit 4 (not the
    self-test's 3), and the running daemon is untouched."""
    port = daemon.url.rsplit(":", 1)[1]
    r = sandboxd("serve", "--port", port, "--state-dir", str(tmp_path / "second"),
                 env={**os.environ, **uid_range_env()})
    assert r.returncode == 4, r.stderr
    assert f"sandboxd: cannot listen on 127.0.0.1:{port}" in r.stderr
    assert "Traceback" not in r.stderr
    assert daemon.client.get("/healthz").status_code == 200


def test_serve_starts_on_the_embedded_default_when_the_policies_dir_is_empty(
    tmp_path: Path,
) -> None:
    """A fresh install: /etc/sandboxd/policies exists but is empty."""
    from tests.support.daemon import running_daemon

    empty = tmp_path / "policies"
    empty.mkdir()
    with running_daemon(tmp_path, policies_dir=empty) as d:
        r = d.invoke("python", {"code": "print(6*7)"})
        assert r.json()["stdout"] == "42\n"
        assert r.json()["policy"]["source"] == "policies/default.yaml"
        assert "embedded default policy" in d.log()


#: uvicorn's access line for a request (peer - "METHOD PATH HTTP/1.1" status)
HEALTHZ_ACCESS_LINE = '"GET /healthz HTTP/1.1" 200'


def test_serve_writes_no_access_log_by_default(daemon: RunningDaemon) -> None:
    """Every call is in the audit log; a line per request in the daemon's log is opt-in."""
    assert daemon.client.get("/healthz").status_code == 200
    assert HEALTHZ_ACCESS_LINE not in daemon.log()  # written before the response, if at all


def test_serve_writes_the_access_log_when_asked(tmp_path: Path) -> None:
    from tests.support.daemon import running_daemon

    with running_daemon(tmp_path, env={"SANDBOXD_ACCESS_LOG": "true"}) as d:
        assert d.client.get("/healthz").status_code == 200
        assert HEALTHZ_ACCESS_LINE in d.log()


def test_session_commands(daemon: RunningDaemon) -> None:
    url = ("--url", daemon.url)
    r = sandboxd("session", "create", "--ttl", "600", *url)
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip()
    assert sid.startswith("ses_")
    r = sandboxd("invoke", "python", "--arg", "code=open('f.txt', 'w').write('hello')",
                 "--session", sid, *url)
    assert r.returncode == 0, r.stderr
    listed = sandboxd("session", "list", *url)
    assert listed.returncode == 0 and sid in listed.stdout, listed.stderr
    data = json.loads(sandboxd("session", "list", "--json", *url).stdout)
    (mine,) = [s for s in data if s["id"] == sid]
    assert mine["workspace_bytes"] >= 5 and mine["kernel"]["live"] == bool(
        mine["kernel"]["backends"])
    shown = sandboxd("session", "show", sid, *url)
    assert shown.returncode == 0 and f"id:         {sid}" in shown.stdout
    assert "kernel:" in shown.stdout and "workspace:" in shown.stdout
    restarted = json.loads(sandboxd("session", "restart", sid, "--json", *url).stdout)
    # exactly the kernels the listing showed were ended (none before the kernels land)
    assert restarted["restarted"] == mine["kernel"]["backends"]
    assert restarted["kernel"] == {"live": False, "backends": []}
    again = sandboxd("session", "restart", sid, *url)
    assert again.returncode == 0 and "no live kernel" in again.stdout
    forked = sandboxd("session", "fork", sid, "--count", "2", *url)
    assert forked.returncode == 0 and "no live Python kernel" in forked.stderr, forked.stderr
    children = forked.stdout.split()
    assert len(children) == 2 and all(c.startswith("ses_") for c in children)
    for child in children:
        read = sandboxd("invoke", "python", "--arg", "code=open('f.txt').read()",
                        "--session", child, *url)
        assert read.returncode == 0 and "hello" in read.stdout, read.stderr
        assert sandboxd("session", "delete", child, *url).returncode == 0
    assert sandboxd("session", "delete", sid, *url).returncode == 0
    gone = sandboxd("session", "show", sid, *url)
    assert gone.returncode == 1 and "HTTP 404" in gone.stderr
    assert len(gone.stderr.strip().splitlines()) == 1 and "Traceback" not in gone.stderr
    assert sid not in sandboxd("session", "list", *url).stdout
    audit = audit_records(daemon.audit_path)
    assert [a["backends"] for a in audit if a["event"] == "kernel_restart"] == [
        mine["kernel"]["backends"], []]


def test_invoke_prints_display_items_one_line_each(daemon: RunningDaemon,
                                                    tmp_path: Path) -> None:
    code = ("class Red:\n    def __repr__(self):\n        return 'line\\x1b[31mred'\n"
            "print('rows')\ndisplay({'n': 2}, Red())")
    r = sandboxd("invoke", "python", "--json", json.dumps({"code": code}), "--url", daemon.url,
                 "--save-outputs", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    # the sandbox's text is shown with its control characters escaped
    assert r.stdout == "rows\n[display] {'n': 2}\n[display] line\\x1b[31mred\n", r.stdout
    assert list((tmp_path / "out").iterdir()) == []  # no images: no files


def test_invoke_prints_output_as_it_arrives(daemon: RunningDaemon) -> None:
    """The first line is on the terminal while the call still runs."""
    code = "import time\nprint('first', flush=True)\ntime.sleep(2)\nprint('second')"
    proc = subprocess.Popen([sys.executable, "-m", "sandboxd", "invoke", "python", "--json",
                             json.dumps({"code": code}), "--url", daemon.url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "first\n"
        assert proc.poll() is None  # the call (and the command) still runs
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert (proc.returncode, out) == (0, "second\n"), err
