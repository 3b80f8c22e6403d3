"""The session's bash kernel on the container backend, through a real daemon and a real Docker
engine: state across calls (directory, variables, functions, aliases), the last command's exit
status, the shell tool's command rules (a denied program anywhere in a pipeline refused before
anything runs, and audited; a program the policy does not allow refused by the kernel's exec
confinement whatever names it), limits, cleanup and isolation between sessions. What every
language's kernel promises (streamed order, interrupt before kill keeping the state, a shell
deaf to it killed with its kernel lost) is tests/parity/test_kernel_parity.py's table; its
restarts are test_bash_restarts.py's."""

from __future__ import annotations

import pytest

from tests.support.audit import audit_records

from .conftest import Daemon

pytestmark = pytest.mark.timeout(300)

def test_directory_variables_functions_and_aliases_persist(daemon: Daemon) -> None:
    sid = daemon.session()
    first = daemon.call("bash", "mkdir -p sub && cd sub\nexport GREETING=hello; n=41\n"
                                "twice() { echo \"$1$1\"; }\nalias say='echo said:'", sid)
    assert first["status"] == "ok", first
    assert first["kernel"] == {"fresh": True, "calls": 1, "lost": False, "reason": None,
                               "interrupted": False}, first
    res = daemon.call("bash", "pwd; echo $GREETING $((n + 1)); twice ab; say it", sid)
    assert res["status"] == "ok", res
    assert res["stdout"] == "/workspace/sub\nhello 42\nabab\nsaid: it\n", res
    assert res["kernel"]["fresh"] is False and res["kernel"]["calls"] == 2, res
    # the variable is in the environment of the programs the kernel runs
    child = daemon.call("bash", "python3 -c 'import os; print(os.environ[\"GREETING\"])'", sid)
    assert child["stdout"] == "hello\n", child
    daemon.close(sid)

@pytest.mark.parametrize(("code", "status", "exit_code"), [
    ("true", "ok", 0), ("false", "error", 1), ("echo x; (exit 3)", "error", 3),
    ("false; true", "ok", 0)])
def test_the_result_carries_the_last_commands_exit_status(daemon: Daemon, code: str,
                                                          status: str, exit_code: int) -> None:
    res = daemon.call("bash", code)  # one-shot: a fresh kernel of its own
    assert res["status"] == status, res
    assert res["termination"] == {"reason": "exited", "exit_code": exit_code,
                                  "signal": None}, res

@pytest.mark.parametrize(("code", "exit_code", "message"), [
    ("echo a\nnosuchcmd --flag\necho b\nnosuchcmd", 127,
     "line 4: nosuchcmd: exit status 127"),
    ("echo x\n\nif then\necho y", 2, "line 3: syntax error near unexpected token `then'"),
    ("f() {\n  false\n}\ntrue\nf", 1, "line 5: false: exit status 1"),
    ("ls /nope\n", 2, "line 1: ls /nope: exit status 2"),
    ("for i in 1 2; do\n  [[ $i == 3 ]]\ndone", 1, "line 2: [[ $i == 3 ]]: exit status 1"),
    # the command's text is one plain line, cut at 200 characters
    ("echo 'a\nb'\nfalse 'x\ty\n" + "z" * 300 + "'", 1,  # bash names a command's last line
     "line 4: " + ("false 'x y " + "z" * 300)[:200] + ": exit status 1"),
    ("false\ntrue", 0, None)])
def test_a_failure_names_its_line_and_command(daemon: Daemon, code: str, exit_code: int,
                                              message: str | None) -> None:
    res = daemon.call("bash", code)
    assert res["termination"]["exit_code"] == exit_code, res
    assert res["message"] == message, res

def test_the_kernel_reserves_the_err_trap_a_users_lasts_its_call(daemon: Daemon) -> None:
    sid = daemon.session()
    mine = daemon.call("bash", "trap 'echo mine $?' ERR\n(exit 4)", sid)
    assert mine["stdout"] == "mine 4\n" and mine["message"] is None, mine
    again = daemon.call("bash", "echo a\n(exit 5)", sid)
    assert again["stdout"] == "a\n", again
    assert again["message"] == "line 2: ( exit 5 ): exit status 5", again
    daemon.close(sid)

@pytest.mark.parametrize("code", ["curl http://example.com", "ls | nc host 1",
                                  "echo a | cat | wc -l | sudo tee x",
                                  "echo $(wget x)", "f() { sudo id; }", "env curl x"])
def test_a_denied_program_is_refused_with_its_rule_and_audited(daemon: Daemon,
                                                               code: str) -> None:
    sid = daemon.session()
    res = daemon.call("bash", code, sid)
    assert res["status"] == "denied", res
    assert res["policy"]["rule"].startswith("tools.shell.commands.deny["), res
    assert "line 1, column" in res["message"], res
    assert res["kernel"] is None  # nothing reached a kernel
    decisions = [r for r in audit_records(daemon.d.audit_path, "decision")
                 if r.get("request_id") == res["id"]]
    assert [d["decision"] for d in decisions] == ["deny"], decisions
    assert decisions[0]["rule"] == res["policy"]["rule"], decisions
    daemon.close(sid)

def test_a_program_not_allowed_cannot_run_whatever_names_it(daemon: Daemon) -> None:
    sid = daemon.session()
    # `id` and `uname` are in the image but not in commands.allow: the kernel's exec
    # confinement refuses them, also through a variable or a nested bash -c
    res = daemon.call("bash", "p=id; $p; echo status=$?; uname; echo status=$?", sid)
    assert res["stdout"] == "status=126\nstatus=126\n", res
    assert "Permission denied" in res["stderr"], res
    assert daemon.call("bash", "echo still here", sid)["stdout"] == "still here\n"
    daemon.close(sid)

def test_limits_end_the_kernel_truthfully(daemon: Daemon) -> None:
    sid = daemon.session()
    assert daemon.call("bash", "x=1", sid)["status"] == "ok"
    memory = daemon.call("bash", "python3 -c 'b = bytearray(400 * 2**20); b[::4096] = "
                                 "b\"x\" * len(b[::4096])'", sid,
                       limits={"memory_bytes": 128 * 2**20})
    assert memory["termination"]["reason"] == "memory_limit", memory
    assert memory["kernel"]["lost"] is True, memory
    pids = daemon.call("bash", "for i in $(seq 40); do sleep 30 & done; wait", sid,
                       limits={"pids": 16})
    assert pids["termination"]["reason"] == "pids_limit", pids
    assert pids["kernel"]["lost"] is True, pids
    assert pids["cleanup"]["verified"] is True, pids
    after = daemon.call("bash", "echo ${x:-fresh}", sid)
    assert after["stdout"] == "fresh\n" and after["kernel"]["fresh"] is True, after
    daemon.close(sid)

def test_background_jobs_end_with_their_call(daemon: Daemon) -> None:
    sid = daemon.session()
    res = daemon.call("bash", "sleep 300 & echo started", sid)
    assert res["status"] == "ok" and res["cleanup"]["verified"] is True, res
    # the call's processes are gone once it ended: what runs now is the container's init,
    # its runner, the kernel and this call's ls
    left = daemon.call("bash", "ls /proc", sid)
    assert len([n for n in left["stdout"].split() if n.isdigit()]) == 4, left
    daemon.close(sid)

def test_sessions_are_isolated(daemon: Daemon) -> None:
    one, two = daemon.session(), daemon.session()
    assert daemon.call("bash", "export SECRET=one; cd /tmp", one)["status"] == "ok"
    res = daemon.call("bash", "echo ${SECRET:-none} $PWD", two)
    assert res["stdout"] == "none /workspace\n", res
    assert daemon.call("bash", "echo $SECRET", one)["stdout"] == "one\n"
    daemon.close(one)
    daemon.close(two)

def test_a_sessions_python_and_bash_kernels_share_the_workspace(daemon: Daemon) -> None:
    sid = daemon.session()
    assert daemon.call("python", "open('from_py.txt', 'w').write('py')", sid)["status"] == "ok"
    res = daemon.call("bash", "cat from_py.txt; echo sh > from_sh.txt", sid)
    assert res["stdout"] == "py", res
    back = daemon.call("python", "open('from_sh.txt').read()", sid)
    assert back["value"] == "sh\n", back
    daemon.close(sid)


@pytest.mark.parametrize("line", ["ls", "echo hi", "pwd", "id", "uname -a", "whoami",
                                  "curl x", "nc h 1", "env"])
def test_shell_and_bash_agree_on_every_program(daemon: Daemon, line: str) -> None:
    """One rule for both tools: a program the shell tool runs, bash runs; one it denies by a
    deny rule, bash denies with the same rule; one it does not allow, bash cannot execute."""
    shell = daemon.d.invoke("shell", {"command": line}).json()
    bash = daemon.call("bash", line)
    if shell["status"] == "ok":
        assert bash["status"] == "ok", (shell, bash)
        assert bash["stdout"] == shell["stdout"], (shell, bash)
    elif shell["policy"]["rule"].startswith("tools.shell.commands.deny["):
        assert bash["status"] == "denied", (shell, bash)
        assert bash["policy"]["rule"] == shell["policy"]["rule"], (shell, bash)
    else:
        assert shell["policy"]["rule"] == "tools.shell.commands.allow", shell
        assert bash["termination"]["exit_code"] == 126, (shell, bash)
        assert "Permission denied" in bash["stderr"], bash
