"""An image build the daemon started dies with the daemon, even one killed with SIGKILL: the
build's ``sandboxd images build`` sets ``PR_SET_PDEATHSIG`` before it reaches the engine
(:func:`sandboxd.cli.images._die_with_daemon`), so no build outlives the daemon that started
it. The "daemon" here is a plain parent process (what is proved is the child's tie to its
parent, the same whatever the parent runs); the engine is a socket that accepts and never
answers, so the build is still waiting on it when its parent is killed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from sandboxd.backends.container.build import DIE_WITH_ENV

pytestmark = pytest.mark.same_on_every_host(
    "a process's death signal is the kernel's, the same on any host")

PARENT = """
import os, subprocess, sys
child = subprocess.Popen(
    [sys.executable, "-m", "sandboxd", "images", "build", "--offline", "--profile", "python",
     "--tag", "sandboxd-test/never-built"],
    env={**os.environ, DIE_WITH: str(os.getpid()), "SANDBOXD_DOCKER_URL": "unix://" + sys.argv[1]},
    stdin=subprocess.DEVNULL)
print(child.pid, flush=True)
child.wait()
""".replace("DIE_WITH", repr(DIE_WITH_ENV))


def test_a_build_dies_with_the_daemon_that_started_it(tmp_path: Path) -> None:
    engine = tmp_path / "engine.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(engine))
        listener.listen(4)
        listener.settimeout(120)  # a bound where a hang is what it catches
        parent = subprocess.Popen([sys.executable, "-c", PARENT, str(engine)],
                                  stdout=subprocess.PIPE, text=True,
                                  cwd=Path(__file__).resolve().parents[2])
        try:
            assert parent.stdout is not None
            build = psutil.Process(int(parent.stdout.readline()))
            # the build reached the engine: its tie to the parent was made before
            conn, _ = listener.accept()
            with conn:
                assert build.is_running()
                os.kill(parent.pid, signal.SIGKILL)
                parent.wait()
                build.wait(timeout=60)  # the kernel's SIGKILL, not the engine's answer
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.wait()
