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


def test_a_command_with_stdin_is_refused_naming_it(e2b_env: E2bDaemon) -> None:
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    with Sandbox.create(template="base") as sbx, pytest.raises(SandboxException,
                                                              match="stdin"):
        sbx.commands.run("cat", background=True, stdin=True)
