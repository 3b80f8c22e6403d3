"""E2B's code-interpreter examples (``e2b_code_interpreter.Sandbox``), unchanged but for the
environment, against the real daemon and its container backend."""

from __future__ import annotations

import pytest

from tests.e2b.conftest import E2bDaemon
from tests.support.audit import audit_records

pytestmark = pytest.mark.docker


def test_state_is_kept_across_run_code_calls(e2b_env: E2bDaemon) -> None:
    from e2b_code_interpreter import Sandbox

    sbx = Sandbox.create()
    try:
        sbx.run_code("x = 1")
        execution = sbx.run_code("x += 1; x")
        assert execution.text == "2"
        assert execution.error is None
    finally:
        sbx.kill()


def test_output_callbacks_arrive_in_order(e2b_env: E2bDaemon) -> None:
    from e2b_code_interpreter import Sandbox

    seen: list[tuple[str, str]] = []
    with Sandbox.create() as sbx:
        execution = sbx.run_code(
            "import sys, time\nprint('one', flush=True)\ntime.sleep(0.2)\n"
            "print('two', file=sys.stderr, flush=True)\ntime.sleep(0.2)\nprint('three')",
            on_stdout=lambda m: seen.append(("out", m.line)),
            on_stderr=lambda m: seen.append(("err", m.line)))
    # each chunk reached its callback as the kernel wrote it, in the order it was written
    assert [(kind, line.strip()) for kind, line in seen if line.strip()] == [
        ("out", "one"), ("err", "two"), ("out", "three")]
    assert "one" in "".join(execution.logs.stdout) and "two" in "".join(execution.logs.stderr)


def test_a_matplotlib_chart_arrives_as_png_and_a_dataframe_as_html(e2b_env: E2bDaemon) -> None:
    import base64

    from e2b_code_interpreter import Sandbox

    with Sandbox.create() as sbx:
        chart = sbx.run_code(
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()")
        frame = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    assert chart.error is None, chart.error
    assert base64.b64decode(chart.results[0].png).startswith(b"\x89PNG\r\n\x1a\n")
    assert frame.error is None, frame.error
    assert "<table" in frame.results[0].html


def test_an_exception_is_the_executions_error(e2b_env: E2bDaemon) -> None:
    from e2b_code_interpreter import Sandbox

    with Sandbox.create() as sbx:
        execution = sbx.run_code("1 / 0")
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert "division by zero" in execution.error.value
    assert "Traceback" in execution.error.traceback


def test_a_runaway_cell_times_out_and_the_context_keeps_its_variables(
        e2b_env: E2bDaemon) -> None:
    from e2b.exceptions import TimeoutException
    from e2b_code_interpreter import Sandbox

    with Sandbox.create() as sbx:
        sbx.run_code("kept = 41")
        with pytest.raises(TimeoutException):
            sbx.run_code("import time\nwhile True:\n    time.sleep(0.1)", timeout=3)
        assert sbx.run_code("kept + 1").text == "42"


def test_a_denied_import_raises_and_is_audited_as_denied(e2b_env: E2bDaemon) -> None:
    from e2b.exceptions import SandboxException
    from e2b_code_interpreter import Sandbox

    with Sandbox.create() as sbx, pytest.raises(SandboxException, match="socket"):
        sbx.run_code("import socket")
    denied = [r for r in audit_records(e2b_env.daemon.audit_path, "decision")
              if r["transport"] == "e2b" and r["decision"] == "deny"]
    assert any("import socket" in str(r["args_preview"]) for r in denied), denied


def test_contexts_create_list_restart_remove(e2b_env: E2bDaemon) -> None:
    from e2b_code_interpreter import Sandbox

    with Sandbox.create() as sbx:
        context = sbx.create_code_context(cwd="/home/user/work")
        sbx.run_code("where = __import__('os').getcwd()", context=context)
        assert sbx.run_code("where", context=context).text.endswith("/work'")
        sbx.run_code("y = 7", context=context)
        assert sbx.run_code("y", context=context).text == "7"
        assert sbx.run_code("'y' in globals()").text == "False"  # the default context's own
        assert context.id in [c.id for c in sbx.list_code_contexts()]
        sbx.restart_code_context(context)
        assert sbx.run_code("'y' in globals()", context=context).text == "False"
        sbx.remove_code_context(context)
        assert context.id not in [c.id for c in sbx.list_code_contexts()]


SECOND_PROCESS = """
import sys
from e2b_code_interpreter import Sandbox
sbx = Sandbox.connect(sys.argv[1])
print(sbx.run_code("shared").text)
"""


def test_connect_from_a_second_process_sees_the_same_state(e2b_env: E2bDaemon) -> None:
    import subprocess
    import sys

    from e2b_code_interpreter import Sandbox

    with Sandbox.create() as sbx:
        sbx.run_code("shared = 'set by the first process'")
        second = subprocess.run([sys.executable, "-c", SECOND_PROCESS, sbx.sandbox_id],
                                capture_output=True, text=True, timeout=120, check=True)
    assert second.stdout.strip() == "'set by the first process'"
