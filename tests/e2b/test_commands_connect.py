"""``commands.connect(pid)`` through the official SDK: another client process attaches to a
running background command and gets its further output and its exit code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2b.conftest import E2bDaemon

pytestmark = pytest.mark.docker

#: prints "ready", waits for the file "go" in the workspace, prints "after" and exits 3
WAITER = ("python3 -c \"import os,time; print('ready',flush=True); "
          "[time.sleep(0.05) for _ in iter(lambda: os.path.exists('go'), True)]; "
          "print('after',flush=True); raise SystemExit(3)\"")

SECOND_PROCESS = """
import json, sys
from e2b import CommandExitException, Sandbox
handle = Sandbox.connect(sys.argv[1]).commands.connect(int(sys.argv[2]))
print("connected", flush=True)
try:
    handle.wait()
    print(json.dumps({"exit": 0}))
except CommandExitException as exc:
    print(json.dumps({"exit": exc.exit_code, "stdout": exc.stdout}))
"""


def test_a_second_process_attaches_to_a_running_command(e2b_env: E2bDaemon) -> None:
    from e2b import CommandExitException, Sandbox

    with Sandbox.create(template="base") as sbx:
        handle = sbx.commands.run(WAITER, background=True)
        second = subprocess.Popen([sys.executable, "-c", SECOND_PROCESS, sbx.sandbox_id,
                                   str(handle.pid)], stdout=subprocess.PIPE, text=True)
        try:
            assert second.stdout is not None
            assert second.stdout.readline().strip() == "connected"
            sbx.files.write("/home/user/go", "")
            out, _ = second.communicate(timeout=120)
        finally:
            if second.poll() is None:
                second.kill()
        # the attached process got what came after it connected, and the exit code
        assert json.loads(out) == {"exit": 3, "stdout": "after\n"}
        # and the stream that started it got all of it
        with pytest.raises(CommandExitException) as first:
            handle.wait()
        assert first.value.exit_code == 3 and first.value.stdout == "ready\nafter\n"


def test_connecting_to_no_such_command_raises(e2b_env: E2bDaemon) -> None:
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    with Sandbox.create(template="base") as sbx, pytest.raises(SandboxException,
                                                              match="4242"):
        sbx.commands.connect(4242)
