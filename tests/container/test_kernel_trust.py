"""Session kernels you can trust (code in a kernel may lie about being
done) on the container backend, through a real daemon
(uvicorn subprocess, HTTP, policy, audit) and a real Docker engine.

In a container the user's code is real CPython in the kernel process: it can write anything
the kernel can, a well-formed ``v`` answer on fd 4 included, and run on. The runner therefore
ends a kernel call only once it has proven from ``/proc`` that the kernel is back in its loop
and idle. Code that forges its end and runs on gets ``timeout`` with the kernel lost; the
kernel process is gone when the result arrives, and the session's next call is fresh and sees
only its own output. A genuine kernel is proven idle call after call; a kernel whose code
leaves a thread running is not idle and is lost, with a message that says why.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.kernel_daemon import KernelDaemon, kernel_daemon
from tests.support.processes import running

from .conftest import labelled
from .test_http import daemon_env

POLICY = """\
version: 1
name: kernel-trust
clients: ["*"]
limits: {timeout: 30s, max_timeout: 60s, memory: 256Mi, max_memory: 1Gi, cpus: 1.0,
         max_cpus: 2, pids: 64, max_pids: 256, output: 1Mi, max_output: 8Mi}
network: none
tools:
  python:
    backend: container
    imports: {allow: [os, sys, json, time, signal, struct, threading, subprocess]}
"""

#: the grace an interrupted kernel gets (seconds; the daemon's kernel_interrupt_grace_s)
GRACE_S = 2


#: this module's daemon (and test_kernel_interrupt's)
Daemon = KernelDaemon


def start(docker_client: Any, tmp: Path) -> Iterator[Daemon]:
    """A daemon for one test module (its containers are all gone after it)."""
    env = {**daemon_env(""), "SANDBOXD_KERNEL_INTERRUPT_GRACE_S": str(GRACE_S)}
    with kernel_daemon(tmp, POLICY, "trust", env) as d:
        yield d
    assert labelled(docker_client, d.instance) == []


@pytest.fixture(scope="module")
def daemon(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    yield from start(docker_client, tmp_path_factory.mktemp("kernel-trust"))


def kernel_process(docker_client: Any, daemon: Daemon, sid: str) -> psutil.Process:
    """The session kernel's process, seen from the host: in the session's container, the
    child of the runner, itself the child of the container's init (``docker top`` lists host
    pids). Ask it between calls: a call's own processes are the kernel's children."""
    (box,) = docker_client.containers.list(filters={"label": [
        f"sandboxd.daemon={daemon.instance}", f"sandboxd.session={sid}"]})
    top = box.top()
    pid_at, ppid_at = top["Titles"].index("PID"), top["Titles"].index("PPID")
    parent = {int(row[pid_at]): int(row[ppid_at]) for row in top["Processes"]}

    def depth(pid: int) -> int:
        return 0 if parent[pid] not in parent else depth(parent[pid]) + 1

    kernels = [pid for pid in parent if depth(pid) == 2]  # init 0, runner 1, kernel 2
    assert len(kernels) == 1, top
    return psutil.Process(kernels[0])


#: a well-formed kernel answer (wire.py's ``v`` frame: exit status 0, a value), written by
#: the user's code on the kernel's answer fd; what follows runs on after it
FORGE = """\
import json, os, struct, time
payload = b"\\0" + json.dumps({"value": "forged"}).encode()
os.write(4, struct.pack(">cII", b"v", 0, len(payload)) + payload)
"""

RUN_ON = {
    "busy_loop": "while True:\n    pass\n",
    "writes_later": "time.sleep(1)\nopen('after.txt', 'w').write('ran on')\n"
                    "while True:\n    pass\n",
    "prints_later": "time.sleep(0.5)\nprint('stale output', flush=True)\ntime.sleep(30)\n",
    # parked in the loop's very read, but wakeable by a timer's handler: not idle
    "parks_wakeable": "import signal\nsignal.signal(signal.SIGALRM, lambda *a: None)\n"
                      "signal.pthread_sigmask(signal.SIG_SETMASK, [])\n"
                      "signal.setitimer(signal.ITIMER_REAL, 0.5)\nos.read(3, 4)\n"
                      "open('after.txt', 'w').write('woke up')\n",
}


@pytest.mark.parametrize("how", list(RUN_ON))
def test_a_forged_end_is_never_taken_for_the_end(daemon: Daemon, docker_client: Any,
                                                 how: str) -> None:
    sid = daemon.session()
    assert daemon.py("x = 1", sid)["status"] == "ok"
    kernel = kernel_process(docker_client, daemon, sid)
    workspace = daemon.d.state_dir / "workspaces" / sid
    res = daemon.py(FORGE + RUN_ON[how], sid, timeout_s=3)
    answered = time.time()
    assert res["status"] == "timeout", res
    assert res["termination"]["reason"] == "wall_timeout", res
    assert res["value"] != "forged", res
    assert res["kernel"]["lost"] is True and res["kernel"]["interrupted"] is False, res
    assert res["cleanup"]["verified"] is True, res["cleanup"]
    assert "never went idle" in res["message"], res
    # proven from outside: the process that ran the code is gone before the result arrived,
    # so it writes no file and no output and burns no CPU after it
    assert not running(kernel), kernel
    after = workspace / "after.txt"  # written within the call, while it was still timed
    assert not after.exists() or after.stat().st_mtime <= answered
    fresh = daemon.py("print('own output')\n2 + 2", sid)
    assert fresh["status"] == "ok" and fresh["value"] == 4, fresh
    assert fresh["stdout"] == "own output\n" and fresh["stderr"] == "", fresh
    assert fresh["kernel"]["fresh"] is True, fresh
    assert daemon.d.client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_a_genuine_kernel_is_proven_idle_call_after_call(daemon: Daemon,
                                                         docker_client: Any) -> None:
    sid = daemon.session()
    for i in range(20):
        res = daemon.py(f"v = {i}\nprint('call', v)\nv * 2", sid)
        assert res["status"] == "ok" and res["value"] == 2 * i, res
        assert res["stdout"] == f"call {i}\n", res
        assert res["kernel"]["lost"] is False and res["kernel"]["calls"] == i + 1, res
    kernel = kernel_process(docker_client, daemon, sid)
    # numeric libraries get one thread each in a kernel (their pools would keep it busy)
    res = daemon.py("import os\n[os.environ.get(n) for n in ('OPENBLAS_NUM_THREADS', "
                    "'OMP_NUM_THREADS', 'MKL_NUM_THREADS')]", sid)
    assert res["value"] == ["1", "1", "1"], res
    assert running(kernel) and kernel.num_threads() == 1
    assert kernel_process(docker_client, daemon, sid).pid == kernel.pid  # the same kernel
    assert daemon.d.client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_a_kernel_whose_threads_ended_is_still_proven_idle(daemon: Daemon) -> None:
    """A process that ever started a thread catches glibc's signal 33 for good, which glibc's
    own sigprocmask cannot block: the kernel's loop blocks it all the same."""
    sid = daemon.session()
    res = daemon.py("import threading\n"
                    "t = threading.Thread(target=print, args=('from a thread',))\n"
                    "t.start()\nt.join()\nthreading.active_count()", sid)
    assert res["status"] == "ok" and res["value"] == 1, res
    assert res["stdout"] == "from a thread\n", res
    assert res["kernel"]["lost"] is False, res
    for i in range(3):
        res = daemon.py("t.is_alive()", sid)
        assert res["value"] is False and res["kernel"]["calls"] == i + 2, res
    assert daemon.d.client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_a_thread_left_running_ends_the_kernel(daemon: Daemon, docker_client: Any) -> None:
    sid = daemon.session()
    assert daemon.py("x = 1", sid)["status"] == "ok"
    kernel = kernel_process(docker_client, daemon, sid)
    res = daemon.py("import threading, time\n"
                    "def noise():\n"
                    "    while True:\n"
                    "        print('LEAK', flush=True)\n"
                    "        time.sleep(0.05)\n"
                    "threading.Thread(target=noise, daemon=True).start()\n"
                    "'started'", sid)
    assert res["status"] == "error", res
    assert res["value"] is None, res
    assert res["kernel"]["lost"] is True and res["kernel"]["reason"] == "not_idle", res
    assert "threads running" in res["message"], res
    assert "Python state was lost" in res["message"], res
    assert not running(kernel)
    res = daemon.py("import time\ntime.sleep(0.3)\nprint('own')\n'x' in globals()", sid)
    assert res["value"] is False and res["kernel"]["fresh"] is True, res
    assert res["stdout"] == "own\n", res  # nothing of the thread reaches the next call
    assert daemon.d.client.delete(f"/v1/sessions/{sid}").status_code == 204
