"""envd's commands and files through the official SDK (``e2b.Sandbox``): each one a call of
the daemon's own tools (shell, read_file, write_file, list_files), decided by the policy and
audited; a denied command raises in the SDK."""

from __future__ import annotations

import pytest

from tests.e2b.conftest import E2bDaemon
from tests.support.audit import audit_records
from tests.support.wait import wait_until

pytestmark = pytest.mark.docker


def test_commands_run_foreground_background_and_exit_codes(e2b_env: E2bDaemon) -> None:
    from e2b import CommandExitException, Sandbox

    with Sandbox.create(template="base") as sbx:
        result = sbx.commands.run("echo hi")
        assert result.stdout == "hi\n" and result.exit_code == 0
        with pytest.raises(CommandExitException) as failed:
            sbx.commands.run("false")
        assert failed.value.exit_code == 1
        handle = sbx.commands.run("sleep 60", background=True)
        listed = wait_until(lambda: [p for p in sbx.commands.list() if p.pid == handle.pid],
                            timeout=30, what="the background command to be listed")
        assert "sleep 60" in " ".join(listed[0].args)
        assert sbx.commands.kill(handle.pid)
        wait_until(lambda: not sbx.commands.list(), timeout=30,
                   what="the killed command to end")
        assert not sbx.commands.kill(handle.pid)  # gone: "not found" is False


def test_a_denied_command_raises_and_is_audited_as_denied(e2b_env: E2bDaemon) -> None:
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    with Sandbox.create(template="base") as sbx, pytest.raises(SandboxException,
                                                              match="curl"):
        sbx.commands.run("curl http://example.com")
    denied = [r for r in audit_records(e2b_env.daemon.audit_path, "decision")
              if r["transport"] == "e2b" and r["decision"] == "deny" and r["tool"] == "shell"]
    assert any("curl" in str(r["args_preview"]) for r in denied), denied


def test_files_write_read_list_exists_make_dir_rename_remove(e2b_env: E2bDaemon) -> None:
    from e2b import Sandbox

    with Sandbox.create(template="base") as sbx:
        sbx.files.write("/home/user/notes.txt", "hello from e2b")
        assert sbx.files.read("/home/user/notes.txt") == "hello from e2b"
        blob = bytes(range(256))
        sbx.files.write("data.bin", blob)
        assert bytes(sbx.files.read("data.bin", format="bytes")) == blob
        assert {e.name for e in sbx.files.list("/home/user")} >= {"notes.txt", "data.bin"}
        assert sbx.files.exists("/home/user/notes.txt")
        assert not sbx.files.exists("/home/user/missing.txt")
        assert sbx.files.make_dir("/home/user/reports")
        assert not sbx.files.make_dir("/home/user/reports")  # there already
        sbx.files.rename("/home/user/notes.txt", "/home/user/reports/notes.txt")
        assert sbx.files.read("/home/user/reports/notes.txt") == "hello from e2b"
        sbx.files.remove("/home/user/reports")
        assert not sbx.files.exists("/home/user/reports")
        # the shell sees the same workspace
        assert sbx.commands.run("cat data.bin").exit_code == 0


def test_a_command_started_with_stdin_reads_what_is_sent_until_close_stdin(
        e2b_env: E2bDaemon) -> None:
    from e2b import Sandbox

    with Sandbox.create(template="base") as sbx:
        handle = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.send_stdin(handle.pid, "first line\n")
        seen = ""
        for stdout, _, _ in handle:  # echoed while it runs, before any close
            seen += stdout or ""
            if "first line\n" in seen:
                break
        assert seen == "first line\n"
        big = "".join(f"{n:07d}\n" for n in range(25_000))  # 200 KB: frames, a full pipe
        sbx.commands.send_stdin(handle.pid, "\u03bb second\n".encode())
        sbx.commands.send_stdin(handle.pid, big)
        sbx.commands.close_stdin(handle.pid)
        result = handle.wait()  # EOF: cat ends by itself
        assert result.exit_code == 0
        assert result.stdout == "first line\n\u03bb second\n" + big
    [record] = [r for r in audit_records(e2b_env.daemon.audit_path, "result")
                if r["transport"] == "e2b" and r["tool"] == "shell"
                and r["session"] == sbx.sandbox_id]
    assert record["status"] == "ok" and record["termination"]["exit_code"] == 0, record
    assert record["stdout_bytes"] == len(result.stdout.encode()), record


def test_stdin_of_a_command_started_without_it_or_over_the_bound_is_refused(
        e2b_env: E2bDaemon) -> None:
    from e2b import Sandbox
    from e2b.exceptions import InvalidArgumentException, SandboxException

    from sandboxd.protocol.limits import MAX_STDIN_BYTES

    with Sandbox.create(template="base") as sbx:
        plain = sbx.commands.run("sleep 60", background=True)
        with pytest.raises(SandboxException, match="not started with stdin"):
            sbx.commands.send_stdin(plain.pid, "x")
        with pytest.raises(SandboxException, match="not started with stdin"):
            sbx.commands.close_stdin(plain.pid)
        assert sbx.commands.kill(plain.pid)
        asleep = sbx.commands.run("sleep 60", background=True, stdin=True)
        sbx.commands.close_stdin(asleep.pid)
        with pytest.raises(InvalidArgumentException, match="closed"):
            sbx.commands.send_stdin(asleep.pid, "late")
        assert sbx.commands.kill(asleep.pid)
        count = "import sys; print(len(sys.stdin.buffer.read()))"
        handle = sbx.commands.run(f'python3 -c "{count}"', background=True, stdin=True)
        # one message within the daemon's body limit (its 413), the whole within the bound
        with pytest.raises(SandboxException, match="max_body_bytes"):
            sbx.commands.send_stdin(handle.pid, b"x" * 1024 * 1024)
        piece = 512 * 1024
        for _ in range(MAX_STDIN_BYTES // piece - 1):
            sbx.commands.send_stdin(handle.pid, b"y" * piece)
        with pytest.raises(InvalidArgumentException, match=str(MAX_STDIN_BYTES)):
            sbx.commands.send_stdin(handle.pid, b"x" * (piece + 1))
        sbx.commands.send_stdin(handle.pid, b"y" * (piece - 3))
        with pytest.raises(InvalidArgumentException, match="in all"):  # the total counts
            sbx.commands.send_stdin(handle.pid, "four")
        sbx.commands.send_stdin(handle.pid, "ok\n")  # what fits is still taken
        sbx.commands.close_stdin(handle.pid)
        # the refused writes sent nothing; the bound itself is taken whole
        assert handle.wait().stdout == f"{MAX_STDIN_BYTES}\n"


def test_files_list_walks_to_the_depth_asked_within_its_bound(e2b_env: E2bDaemon) -> None:
    from e2b import Sandbox
    from e2b.exceptions import InvalidArgumentException, SandboxException

    from sandboxd.api.e2b.files import MAX_LIST_DEPTH, MAX_LIST_ENTRIES

    with Sandbox.create(template="base") as sbx:
        sbx.files.write("/home/user/a/b/c/deep.txt", "x")
        sbx.files.write("/home/user/a/top.txt", "y")
        one = {e.path for e in sbx.files.list("/home/user/a")}
        assert one == {"/home/user/a/b", "/home/user/a/top.txt"}
        three = {e.path for e in sbx.files.list("/home/user/a", depth=3)}
        assert three == one | {"/home/user/a/b/c", "/home/user/a/b/c/deep.txt"}
        two = {e.path for e in sbx.files.list("/home/user/a", depth=2)}
        assert two == one | {"/home/user/a/b/c"}
        with pytest.raises(InvalidArgumentException, match=str(MAX_LIST_DEPTH)):
            sbx.files.list("/home/user", depth=MAX_LIST_DEPTH + 1)
        # more entries than the bound in all: refused, never a listing cut short in silence
        sbx.files.write("mk.py", f"import os\nfor d in 'pq':\n    os.makedirs(f'w/{{d}}')\n"
                        f"    for i in range({MAX_LIST_ENTRIES // 2 + 1}):\n"
                        f"        open(f'w/{{d}}/{{i}}', 'w').close()\n")
        sbx.commands.run("python3 mk.py")
        assert len(sbx.files.list("/home/user/w/p")) == MAX_LIST_ENTRIES // 2 + 1
        with pytest.raises(SandboxException, match=str(MAX_LIST_ENTRIES)):
            sbx.files.list("/home/user/w", depth=2)
