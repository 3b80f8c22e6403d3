"""Per-call rlimits in the container runner (the rlimits of a request's ``limits``),
run on the host through the runner's own loop (tests/support/runner_host.py): set in every process a
call starts before user code - the python worker, a plan's commands (a pipeline's too), the
session kernel -, never by posix_spawn, and a request that asks for anything a call may not
set is refused whole, with nothing started."""

from __future__ import annotations

import resource
import sys
from pathlib import Path
from typing import Any

import pytest

from sandboxd.protocol import limits
from sandboxd.protocol.call import RunnerPart, WorkerReport, WorkerRequest
from sandboxd.protocol.plan import Plan
from tests.support.plan import runner_module
from tests.support.runner_host import run_request, stop_kernel

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
#: python code that opens files until it cannot: how many it held, and why it stopped
OPEN_UNTIL_REFUSED = (
    "import os\n"
    "fds = []\n"
    "try:\n"
    "    while len(fds) < 40:\n"
    "        fds.append(os.open('/dev/null', os.O_RDONLY))\n"
    "except OSError as exc:\n"
    "    print('refused', exc.errno, max(fds))\n"
    "else:\n"
    "    print('held', len(fds))\n"
)


def nofile(n: int) -> dict[str, Any]:
    """The ``limits`` of a request whose open_files limit is ``n``."""
    return {"limits": limits.Limits(open_files=n).to_wire()}


def plan(*commands: list[str]) -> dict[str, Any]:
    """A plan of one pipeline of ``commands``."""
    return {"pipelines": [{"commands": [{"argv": argv} for argv in commands],
                           "run_if": "always"}]}


def test_every_name_of_the_contract_is_an_rlimit() -> None:
    assert "RLIMIT_NOFILE" in limits.RLIMIT_NAMES  # the open_files limit
    assert {n for n in dir(resource) if n.startswith("RLIMIT_")} >= limits.RLIMIT_NAMES


def test_a_plan_s_command_has_the_call_s_nofile(tmp_path: Path) -> None:
    reply = run_request({"kind": "plan", "env": ENV, "plan": plan(["sh", "-c", "ulimit -n"]),
                         **nofile(20)}, tmp_path)
    assert reply.started and reply.record.exit_code == 0, reply
    assert reply.stdout == b"20\n"


def test_every_command_of_a_pipeline_has_it(tmp_path: Path) -> None:
    reply = run_request({"kind": "plan", "env": ENV, **nofile(20),
                         "plan": plan(["sh", "-c", "ulimit -n; ulimit -Hn"],
                                      [sys.executable, "-c", OPEN_UNTIL_REFUSED
                                       .replace("import os", "import os, sys\n"
                                                "print(sys.stdin.read().split())")])},
                        tmp_path)
    assert reply.record.exit_code == 0, reply
    lines = reply.stdout.decode().splitlines()
    assert lines[0] == "['20', '20']"  # the first command's soft and hard limit
    verdict = lines[1].split()
    assert verdict[:2] == ["refused", "24"] and int(verdict[2]) < 20  # EMFILE below 20


def test_python_code_cannot_hold_more_files(tmp_path: Path) -> None:
    reply = run_request({"kind": "python", "code": OPEN_UNTIL_REFUSED, "env": ENV,
                         "imports_allow": ["os"], **nofile(20)}, tmp_path)
    assert reply.record.exit_code == 0, reply
    verdict = reply.stdout.split()
    assert verdict[:2] == [b"refused", b"24"] and int(verdict[2]) < 20


def test_a_request_without_limits_applies_the_default_open_files(tmp_path: Path) -> None:
    """A call always has limits (the request's default is the policy's default): a request
    that names none still gets the default open_files, never the runner's own."""
    reply = run_request({"kind": "plan", "env": ENV,
                         "plan": plan(["sh", "-c", "ulimit -n; ulimit -Hn"])}, tmp_path)
    assert reply.record.exit_code == 0, reply
    n = str(limits.Limits().open_files).encode()
    assert reply.stdout.split() == [n, n]


def test_the_kernel_keeps_its_first_call_s_rlimits(tmp_path: Path) -> None:
    code = "import resource\nresource.getrlimit(resource.RLIMIT_NOFILE)"
    call = {"kind": "python", "kernel": True, "code": code, "env": ENV,
            "imports_allow": ["resource"]}
    try:
        first = run_request({**call, **nofile(20)}, tmp_path)
        assert first.record.value == [20, 20], first
        second = run_request({**call, **nofile(30)}, tmp_path)
        assert second.record.value == [20, 20], second
        assert second.record.kernel_fresh is False
    finally:
        stop_kernel()


def test_one_plain_command_with_rlimits_is_not_spawned(tmp_path: Path) -> None:
    """posix_spawn cannot set rlimits in its child: such a call takes the fork path."""
    rlimits, worker = runner_module("rlimits"), runner_module("worker")
    asked = rlimits.requested_rlimits({"RLIMIT_NOFILE": 20})
    request = WorkerRequest(kind="plan", runner=RunnerPart(cwd=str(Path.cwd()), env=ENV),
                            plan=Plan.from_wire(plan(["true"])))
    assert worker.spawn_command(request, 1, 2, asked) is None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    same = rlimits.requested_rlimits({"RLIMIT_NOFILE": hard})
    assert rlimits.inherited_as_is(same) == (soft == hard)
    assert rlimits.inherited_as_is(())


def test_one_plain_command_with_rlimits_is_exec_d_by_the_worker() -> None:
    """Such a command is the worker itself, as it would have been posix_spawn's child: no
    interpreter waits for it, and a signal that ends it is the call's signal."""
    cwd = Path.cwd()  # where the runner runs (posix_spawn's condition)
    reply = run_request({"kind": "plan", "env": ENV, **nofile(20),
                         "plan": plan(["sh", "-c", "ulimit -n; echo $$; kill -TERM $$"])}, cwd)
    assert reply.stdout.split() == [b"20", str(reply.pid).encode()], reply
    assert (reply.record.exit_code, reply.record.signal) == (None, 15), reply


@pytest.mark.parametrize(("asked", "why"), [
    ({"open_files": 8}, "open_files must be between 16 and 1024"),
    ({"open_files": 1 << 20}, "open_files must be between 16 and 1024"),
    ({"open_files": -1}, "open_files must be between 16 and 1024"),
    ({"open_files": "20"}, "open_files must be a number"),
    ({"open_files": 20.5}, "open_files must be a whole number"),
    ({"open_files": True}, "open_files must be a number"),
    ({"open_files": None}, "open_files must be a number"),
    ({"RLIMIT_CORE": 0}, "limits must have exactly the keys"),
    ([["open_files", 20]], "limits must have exactly the keys"),
])
@pytest.mark.parametrize("kind", ["plan", "python", "kernel"])
def test_what_a_call_may_not_set_is_refused_whole(tmp_path: Path, asked: Any, why: str,
                                                  kind: str) -> None:
    marker = tmp_path / "ran"
    wire = ({**limits.Limits().to_wire(), **asked} if isinstance(asked, dict) else asked)
    request: dict[str, Any] = {"env": ENV, "limits": wire}
    if kind == "plan":
        request |= {"kind": "plan", "plan": plan(["touch", str(marker)])}
    else:
        request |= {"kind": "python", "kernel": kind == "kernel", "imports_allow": ["pathlib"],
                    "code": f"import pathlib\npathlib.Path({str(marker)!r}).touch()"}
    reply = run_request(request, tmp_path)
    assert not reply.started
    error = reply.record.error or ""
    assert reply.record == WorkerReport(error=error), reply  # nothing else: nothing ran
    assert error.startswith("refused: ") and why in error, error
    assert not marker.exists()
    assert not runner_module("main").KERNEL.alive


@pytest.mark.parametrize(("rlimits", "why"), [
    ({"RLIMIT_CORE": 0}, "'RLIMIT_CORE' is not one a call may set"),
    ({"RLIMIT_NOFILE": 20, "RLIMIT_AS": 1 << 30}, "'RLIMIT_AS' is not one a call may set"),
    ({"RLIMIT_BOGUS": 1}, "'RLIMIT_BOGUS' is not one a call may set"),
    ({"RLIMIT_NOFILE": "20"}, "RLIMIT_NOFILE must be an integer"),
    ({"RLIMIT_NOFILE": 20.0}, "RLIMIT_NOFILE must be an integer"),
    ({"RLIMIT_NOFILE": True}, "RLIMIT_NOFILE must be an integer"),
    ({"RLIMIT_NOFILE": None}, "RLIMIT_NOFILE must be an integer"),
    ({"RLIMIT_NOFILE": -1}, "RLIMIT_NOFILE = -1 is outside 0 .. the runner's own hard limit"),
    ([["RLIMIT_NOFILE", 20]], "rlimits must map RLIMIT_* names to integers"),
])
def test_the_runner_checks_the_rlimits_it_is_asked_to_set(rlimits: Any, why: str) -> None:
    """What the runner applies is checked again there (the limits' rlimits, by name and
    against its own hard limits), whole, before anything starts."""
    with pytest.raises(ValueError) as caught:
        runner_module("rlimits").requested_rlimits(rlimits)
    assert why in str(caught.value)


def test_a_value_above_the_runner_s_hard_limit_is_refused() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Linux caps RLIMIT_NOFILE at fs.nr_open: it is never unlimited
    assert hard != resource.RLIM_INFINITY, hard
    with pytest.raises(ValueError) as caught:
        runner_module("rlimits").requested_rlimits({"RLIMIT_NOFILE": hard + 1})
    assert str(caught.value) == (f"rlimit RLIMIT_NOFILE = {hard + 1} is outside "
                                 f"0 .. the runner's own hard limit ({hard})")
