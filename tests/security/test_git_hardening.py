"""git runs no program that repository content names (hooks, filters, pagers
would run it outside the policy), through the real daemon
and the container backend.

The shipped ``git_status`` tool ran attacker-chosen programs: a ``.git`` *file* (``gitdir: g``)
plus ``g/config`` with ``core.fsmonitor=<command>``, both written with ``write_file`` (which
only denies ``.git/config``), made ``git status`` run it through ``/bin/sh``. Every attack here
writes a marker file if its program runs; none may appear, and git itself keeps working.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

import pytest

from sandboxd.protocol.plan import Pipeline, Plan, PlannedCommand
from tests.policy.helpers import write
from tests.support.ci import require
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.plan import execute

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = pytest.mark.same_on_every_host(
    "git's own configuration and the environment the daemon gives it: the same on any host "
    "(the container it runs in is test_confinement's in the VM)")

POLICY = """\
version: 1
name: git
clients: ["*"]
limits: {timeout: 60s}
tools:
  shell:
    backend: container
    commands: {allow: [git, ls, cat, echo, timeout, xargs, env]}
    operators: true
  write_file:
    paths: {allow: ["**"], deny: ["**/.git/config", "**/.git/hooks/**"]}
custom_tools:
  git_status:
    description: Short status of the git repository in the workspace.
    backend: container
    argv: [git, status, --short]
"""
MARK = "/workspace/PWNED"
RUN = f"touch {MARK}-$$; echo PWNED-RAN >&2"


def _session(d: RunningDaemon) -> tuple[str, Path]:
    sid = d.client.post("/v1/sessions", json={}).json()["id"]
    return sid, d.state_dir / "workspaces" / sid


def _write(d: RunningDaemon, sid: str, path: str, content: str) -> None:
    r = d.invoke("write_file", {"path": path, "content": content}, session=sid).json()
    assert r["status"] == "ok", r


def _call(d: RunningDaemon, sid: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    r = d.invoke(tool, arguments, session=sid)
    assert r.status_code == 200, r.text
    return r.json()


def _moved_repo(d: RunningDaemon, sid: str, config: str) -> None:
    """A repository whose .git is a file pointing at g/, with ``config`` as its configuration:
    everything through write_file, as in the report."""
    _write(d, sid, ".git", "gitdir: g\n")
    _write(d, sid, "g/HEAD", "ref: refs/heads/main\n")
    _write(d, sid, "g/objects/info/.keep", "")
    _write(d, sid, "g/refs/heads/.keep", "")
    _write(d, sid, "g/config", "[core]\n\trepositoryformatversion = 0\n" + config)


def _pwned(ws: Path) -> list[str]:
    return sorted(p.name for p in ws.iterdir() if p.name.startswith("PWNED"))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, docker_client: object) -> Any:
    """One daemon for the module (every test works in its own session): a daemon start costs
    half a minute under the modern-host VM's software emulation."""
    tmp_path = tmp_path_factory.mktemp("git-daemon")
    policies = tmp_path / "policies"
    write(policies, "git.yaml", POLICY)
    with running_daemon(tmp_path, policies_dir=policies,
                        env={"SANDBOXD_WARM_POOL_SIZE": "0"}) as d:
        yield d


@pytest.mark.docker
def test_fsmonitor_in_a_moved_repository_config_does_not_run(daemon: RunningDaemon) -> None:
    sid, ws = _session(daemon)
    _moved_repo(daemon, sid, f'\tfsmonitor = "{RUN}"\n\tpager = "{RUN}"\n'
                             f'\thooksPath = g/hooks\n[alias]\n\tst = "!{RUN}"\n'
                             f'[core]\n\tsshCommand = "{RUN}"\n')
    _write(daemon, sid, "notes.txt", "hello\n")
    body = _call(daemon, sid, "git_status", {})
    assert body["status"] == "ok", body
    assert "?? notes.txt" in body["stdout"], body
    assert _pwned(ws) == [], body
    # the same through the shell tool, and an alias standing in for a subcommand
    body = _call(daemon, sid, "shell", {"command": "git status --short && git log -1; git st"})
    assert _pwned(ws) == [], body
    assert "?? notes.txt" in body["stdout"], body
    assert "PWNED-RAN" not in body["stderr"], body


@pytest.mark.docker
def test_filter_driver_selected_by_attributes_cannot_start(daemon: RunningDaemon) -> None:
    """No ``-c`` can switch off a driver whose name the repository chooses: git is confined
    to executing git's own programs (Landlock), so the driver fails to start."""
    sid, ws = _session(daemon)
    _moved_repo(daemon, sid, f'[filter "x"]\n\tclean = "{RUN}; cat"\n\tsmudge = "{RUN}; cat"\n'
                             f'[diff "x"]\n\ttextconv = "{RUN}; cat"\n\tcommand = "{RUN}"\n'
                             '[user]\n\tname = a\n\temail = a@example.com\n')
    _write(daemon, sid, ".gitattributes", "* filter=x diff=x\n")
    _write(daemon, sid, "f.txt", "one\n")
    body = _call(daemon, sid, "shell", {"command": "git add f.txt; git commit -q -m one; "
                                                   "echo two >> f.txt; git diff; git status"})
    assert _pwned(ws) == [], body
    assert "cannot exec" in body["stderr"], body  # git did try: the kernel said no
    body = _call(daemon, sid, "git_status", {})
    assert _pwned(ws) == [], body
    assert body["status"] == "ok" and "f.txt" in body["stdout"], body


@pytest.mark.docker
@pytest.mark.parametrize(("line", "fragment"), [
    (f"git -c core.fsmonitor='{RUN}' status", "`-c`"),
    ("git --config-env=core.pager=X log", "`--config-env`"),
    ("git --exec-path=/workspace status", "`--exec-path`"),
    ("env GIT_CONFIG_GLOBAL=/workspace/c git status", "`env` may not change"),
    ("echo status | xargs git", "Give git its subcommand"),
])
def test_options_that_would_undo_the_hardening_are_refused(daemon: RunningDaemon, line: str,
                                                           fragment: str) -> None:
    sid, ws = _session(daemon)
    body = _call(daemon, sid, "shell", {"command": line})
    assert body["status"] == "denied", body
    assert fragment in body["message"], body["message"]
    assert _pwned(ws) == []


@pytest.mark.docker
def test_git_keeps_working(daemon: RunningDaemon) -> None:
    sid, ws = _session(daemon)
    _write(daemon, sid, "a.txt", "a\n")
    body = _call(daemon, sid, "shell", {"command": "git init -q && git status --short && "
                                                   "timeout 20 git status --short"})
    assert body["status"] == "ok", body
    assert body["stdout"] == "?? a.txt\n?? a.txt\n", body
    body = _call(daemon, sid, "git_status", {})
    assert (body["status"], body["stdout"]) == ("ok", "?? a.txt\n"), body
    assert (ws / ".git" / "HEAD").is_file()


def _landlock_abi() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return max(0, libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))


def test_the_runner_confines_what_a_program_may_execute(tmp_path: Path) -> None:
    """The runner's exec confinement (what git runs under), on this host's kernel and with a
    program every host has: the confined program runs, whatever it starts does not."""
    require(_landlock_abi() > 0, "Landlock in this kernel")
    python = Path(sys.executable)
    env = {"PATH": f"{python.parent}:/usr/bin:/bin"}
    start_true = "import subprocess, sys; sys.exit(subprocess.run(['true']).returncode)"

    def run(argv: list[str], exec_only: list[str] | None) -> tuple[int, bytes, bytes]:
        cmd = PlannedCommand(argv=argv, exec_only=exec_only)
        return execute(Plan(pipelines=[Pipeline(commands=[cmd])]), tmp_path, env)

    assert run([python.name, "-c", start_true], None)[0] == 0  # unconfined: it may
    status, _, err = run([python.name, "-c", start_true], [python.name])
    assert status == 1 and b"PermissionError" in err, err
    assert run([python.name, "-c", "print(6 * 7)"], [python.name])[:2] == (0, b"42\n")
    status, _, err = run(["true"], [python.name])  # not in the list: not even started
    assert status == 126 and b"permission denied" in err, err
