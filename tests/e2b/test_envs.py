"""E2B's ``envs`` through the official SDKs: the sandbox's variables, seen by its commands and
its code, a call's own on top for that call only, kept across pause and ``connect``; names
the confinement relies on are refused with the SDK's error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2b.conftest import E2bDaemon
from tests.support.audit import audit_records

pytestmark = pytest.mark.docker

ENVIRON = "__import__('os').environ.get('{}', 'unset')"


def test_sandbox_envs_reach_commands_and_code_and_a_calls_own_override(
        e2b_env: E2bDaemon) -> None:
    from e2b_code_interpreter import Sandbox

    with Sandbox.create(envs={"FOO": "sandbox foo", "BAR": "bar"}) as sbx:
        assert sbx.commands.run("printenv FOO").stdout == "sandbox foo\n"
        # a command's own variables override the sandbox's, for that command only
        assert sbx.commands.run("printenv FOO", envs={"FOO": "mine"}).stdout == "mine\n"
        assert sbx.commands.run("printenv BAR", envs={"FOO": "mine"}).stdout == "bar\n"
        assert sbx.commands.run("printenv FOO").stdout == "sandbox foo\n"
        assert sbx.run_code(ENVIRON.format("FOO")).text == "'sandbox foo'"
        assert sbx.run_code(ENVIRON.format("FOO"), envs={"FOO": "cell"}).text == "'cell'"
        assert sbx.run_code(ENVIRON.format("ONLY"), envs={"ONLY": "once"}).text == "'once'"
        # the next cell has the sandbox's values again, and not the last cell's own
        assert sbx.run_code(ENVIRON.format("FOO")).text == "'sandbox foo'"
        assert sbx.run_code(ENVIRON.format("ONLY")).text == "'unset'"
        bash = sbx.run_code("echo \"$FOO/$BAR\"", language="bash")
        assert "".join(bash.logs.stdout) == "sandbox foo/bar\n", bash


def test_a_cell_that_changes_a_sandbox_variable_keeps_its_change(e2b_env: E2bDaemon) -> None:
    from e2b_code_interpreter import Sandbox

    with Sandbox.create(envs={"FOO": "sandbox foo"}) as sbx:
        sbx.run_code("import os\nos.environ['FOO'] = 'changed'")
        assert sbx.run_code(ENVIRON.format("FOO")).text == "'changed'"
        sbx.run_code("export FOO=changed-too", language="bash")
        again = sbx.run_code("echo \"$FOO\"", language="bash")
        assert "".join(again.logs.stdout) == "changed-too\n"
        # a restarted kernel starts with the sandbox's variables again
        sbx.restart_code_context(sbx.sandbox_id)  # the default context: the sandbox's
        assert sbx.run_code(ENVIRON.format("FOO")).text == "'sandbox foo'"


def test_envs_are_kept_across_pause_and_connect(e2b_env: E2bDaemon) -> None:
    from e2b_code_interpreter import Sandbox

    with Sandbox.create(envs={"KEPT": "across"}) as sbx:
        sbx.run_code("1")  # the container exists: there is something to pause
        assert sbx.pause() is True
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.commands.run("printenv KEPT").stdout == "across\n"
        second = subprocess.run(
            [sys.executable, "-c", "import sys\nfrom e2b import Sandbox\n"
             "print(Sandbox.connect(sys.argv[1]).commands.run('printenv KEPT').stdout)",
             sbx.sandbox_id], capture_output=True, text=True, timeout=120, check=True)
        assert second.stdout.strip() == "across"


@pytest.mark.parametrize("name", ["PATH", "LD_PRELOAD", "https_proxy", "PYTHONPATH"])
def test_names_the_confinement_relies_on_are_refused(e2b_env: E2bDaemon, name: str) -> None:
    from e2b.exceptions import InvalidArgumentException, SandboxException
    from e2b_code_interpreter import Sandbox

    with pytest.raises(SandboxException, match=name):
        Sandbox.create(envs={name: "/home/user/evil"})
    with Sandbox.create() as sbx:
        with pytest.raises(InvalidArgumentException, match=name):
            sbx.commands.run("printenv", envs={name: "/home/user/evil"})
        with pytest.raises(SandboxException, match=name):
            sbx.run_code("1", envs={name: "/home/user/evil"})


def test_too_many_or_too_large_envs_are_refused(e2b_env: E2bDaemon) -> None:
    from e2b.exceptions import SandboxException
    from e2b_code_interpreter import Sandbox

    with pytest.raises(SandboxException, match="at most 64"):
        Sandbox.create(envs={f"V{i}": "x" for i in range(65)})
    with pytest.raises(SandboxException, match="bytes"):
        Sandbox.create(envs={"BIG": "x" * (32 * 1024 + 1)})


def test_a_command_with_envs_is_one_audited_shell_call(e2b_env: E2bDaemon) -> None:
    from e2b import Sandbox

    with Sandbox.create(template="base") as sbx:
        assert sbx.commands.run("printenv AUDITED", envs={"AUDITED": "yes"}).stdout == "yes\n"
    calls = [r for r in audit_records(e2b_env.daemon.audit_path, "decision")
             if r["transport"] == "e2b" and r["tool"] == "shell"
             and "printenv AUDITED" in str(r["args_preview"])]
    assert calls and calls[-1]["decision"] == "allow", calls
