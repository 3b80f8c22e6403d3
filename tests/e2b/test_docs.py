"""docs/e2b.md's example, run as it is written (in a process of its own, with the
environment the doc gives), and its template map compared with the daemon's default."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sandboxd.config import Settings
from tests.e2b.conftest import E2bDaemon

DOC = Path(__file__).resolve().parents[2] / "docs" / "e2b.md"


def _block(language: str, marker: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)
    (block,) = [b for b in blocks if marker in b]
    return block


@pytest.mark.docker
def test_the_docs_example_runs_as_written(e2b_daemon: E2bDaemon) -> None:
    code = _block("python", "from e2b_code_interpreter import Sandbox")
    env = {**e2b_daemon.env(), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["2", "hi"]


def test_the_docs_template_map_is_the_default() -> None:
    shown = yaml.safe_load(_block("yaml", "e2b_templates"))["e2b_templates"]
    assert shown == Settings.model_fields["e2b_templates"].get_default(call_default_factory=True)
