"""E2B's JavaScript SDK (``@e2b/code-interpreter``, pinned in tests/e2b/js, installed by
``make test`` into .cache/npm/e2b-js): its documented example, unchanged but for the
environment, run by node against the daemon; and what the Python SDK's tests prove of envs,
Bash cells and ``commands.connect``, from JavaScript."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2b.conftest import E2bDaemon
from tests.support.ci import require

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
TREE = REPO / ".cache/npm/e2b-js/node_modules"
EXAMPLE = Path(__file__).resolve().parent / "js" / "example.mjs"


def _node_version(node: str) -> tuple[int, ...]:
    out = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    return tuple(int(p) for p in out.stdout.strip().lstrip("v").split("."))


def _run_node(e2b_daemon: E2bDaemon, tmp_path: Path, name: str) -> list[str]:
    """The script ``js/<name>`` run by node against the daemon: its stdout's lines."""
    node = shutil.which("node")
    require(node is not None, "node (make test installs nodejs when it is missing)")
    assert node is not None
    require(_node_version(node) >= (20, 18, 1), "node >= 20.18.1 (E2B's JavaScript SDK)")
    require(TREE.is_dir(), f"E2B's JavaScript SDK in {TREE} (make test installs it: npm ci "
            "from tests/e2b/js)")
    # ES modules resolve their imports beside the script: the pinned tree next to a copy
    (tmp_path / "node_modules").symlink_to(TREE)
    script = tmp_path / name
    shutil.copy(EXAMPLE.parent / name, script)
    run = subprocess.run([node, str(script)], env={**e2b_daemon.env(), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    return run.stdout.split("\n")


def test_the_js_sdk_example_runs_against_sandboxd(e2b_daemon: E2bDaemon,
                                                  tmp_path: Path) -> None:
    out = _run_node(e2b_daemon, tmp_path, EXAMPLE.name)
    assert out[:3] == ["2", "hi", "hello"], out


def test_envs_bash_and_commands_connect_from_the_js_sdk(e2b_daemon: E2bDaemon,
                                                        tmp_path: Path) -> None:
    out = _run_node(e2b_daemon, tmp_path, "features.mjs")
    assert out[:5] == ["sandbox foo", "mine", "'cell'", "sandbox foo", "exit 3 after"], out
