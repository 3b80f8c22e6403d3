"""``run_code`` in another language through the official SDK: ``bash`` is the session's bash
kernel (its state kept across cells), in the default context or a context of its own; an
unknown language is a clear error; a denied command raises and is audited as denied."""

from __future__ import annotations

import pytest

from tests.e2b.conftest import E2bDaemon
from tests.support.audit import audit_records

pytestmark = pytest.mark.docker
SERVED = r"'cobol'.*bash, javascript, js, python, ts, typescript"


def test_bash_cells_keep_their_state(e2b_env: E2bDaemon) -> None:
    from e2b_code_interpreter import Sandbox

    with Sandbox.create() as sbx:
        sbx.run_code("mkdir -p sub && cd sub && export GREETING=hello", language="bash")
        cell = sbx.run_code("echo \"$GREETING from $(pwd)\"", language="bash")
        assert "".join(cell.logs.stdout) == "hello from /workspace/sub\n", cell
        assert cell.error is None
        failed = sbx.run_code("false", language="bash")
        assert failed.error is not None
        # Python's kernel is another one: its cwd did not move
        assert sbx.run_code("__import__('os').getcwd()").text == "'/workspace'"


def test_a_bash_context_is_its_own_kernel(e2b_env: E2bDaemon) -> None:
    from e2b_code_interpreter import Sandbox

    with Sandbox.create() as sbx:
        context = sbx.create_code_context(language="bash", cwd="/home/user/shells")
        assert context.language == "bash"
        sbx.run_code("X=in-context", context=context)
        here = sbx.run_code("echo \"$X $(pwd)\"", context=context)
        assert "".join(here.logs.stdout) == "in-context /workspace/shells\n", here
        default = sbx.run_code("echo \"[$X]\"", language="bash")
        assert "".join(default.logs.stdout) == "[]\n"
        listed = {c.id: c.language for c in sbx.list_code_contexts()}
        assert listed[context.id] == "bash"


def test_an_unknown_language_names_it_and_those_served(e2b_env: E2bDaemon) -> None:
    from e2b.exceptions import SandboxException
    from e2b_code_interpreter import Sandbox

    with Sandbox.create() as sbx:
        with pytest.raises(SandboxException, match=SERVED):
            sbx.run_code("DISPLAY 'HI'", language="cobol")
        with pytest.raises(SandboxException, match=SERVED):
            sbx.create_code_context(language="cobol")


def test_a_denied_bash_command_raises_and_is_audited(e2b_env: E2bDaemon) -> None:
    from e2b.exceptions import SandboxException
    from e2b_code_interpreter import Sandbox

    with Sandbox.create() as sbx, pytest.raises(SandboxException, match="curl"):
        sbx.run_code("curl http://example.com", language="bash")
    denied = [r for r in audit_records(e2b_env.daemon.audit_path, "decision")
              if r["transport"] == "e2b" and r["decision"] == "deny" and r["tool"] == "bash"]
    assert any("curl" in str(r["args_preview"]) for r in denied), denied


@pytest.mark.parametrize(("js", "ts"), [("javascript", "typescript"), ("js", "ts")])
def test_javascript_and_typescript_cells_share_the_node_kernel(e2b_env: E2bDaemon, js: str,
                                                               ts: str) -> None:
    from e2b_code_interpreter import Sandbox

    with Sandbox.create(envs={"WHO": "sandbox"}) as sbx:
        sbx.run_code("let n = await Promise.resolve(20)", language=js)
        cell = sbx.run_code("const m: number = n + 1; console.log(process.env.WHO); m * 2",
                            language=ts)
        assert cell.error is None, cell
        assert cell.text == "42" and "".join(cell.logs.stdout) == "sandbox\n", cell
        failed = sbx.run_code("null.x", language=js)
        assert failed.error is not None and failed.error.name == "TypeError", failed


def test_a_javascript_context_has_its_own_directory(e2b_env: E2bDaemon) -> None:
    from e2b_code_interpreter import Sandbox

    with Sandbox.create() as sbx:
        context = sbx.create_code_context(language="javascript", cwd="/home/user/scripts")
        assert context.language == "javascript"
        here = sbx.run_code("process.cwd()", context=context)
        assert here.error is None and here.text == "'/workspace/scripts'", here
