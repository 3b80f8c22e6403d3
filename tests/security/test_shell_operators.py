"""Shell operators through the real daemon and the container backend (a line the
policy reads one way must not run another way).

With ``operators: true`` the policy's reading of a line and /bin/sh's disagreed (comments,
nested quotes in parameter expansions), so denied programs ran. Now the line never reaches a
shell: the parsed plan the policy checked is what the runner in the container executes. The
attack lines are refused; ordinary lines with pipes, sequencing and redirects still work, and
redirects stay inside the workspace.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.policy.helpers import write
from tests.support.daemon import RunningDaemon, running_daemon

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = pytest.mark.same_on_every_host(
    "a command line is parsed and checked by the policy, and the runner executes the parsed "
    "plan: the same code on any host; the container's confinement is proven in the VM by "
    "test_kernel_escapes and test_confinement")

POLICY = """\
version: 1
name: ops
clients: ["*"]
limits: {timeout: 60s}
tools:
  shell:
    backend: container
    commands: {allow: [echo, cat, ls, "true", "false", wc, sort, seq, head, tr], deny: [id, sh]}
    operators: true
"""
# each would run `id` (or a shell) under /bin/sh while reading as allowed commands to a
# tokenizer that does not model comments or parameter expansions
ATTACKS = [
    "true #'\nid\n#'",
    "echo \"${x#\"'\"}\"; id #'",
    "echo ${x:-'}; id #'",
    "true #\\\nid",
    "echo $(id)",
    "echo `id`",
    "true & id",
    "(id)",
    "cat <<E\nE\nid",
    "echo $0; id",
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, docker_client: object) -> Any:
    """One daemon for the module (every test uses its own session or one-shot calls)."""
    tmp_path = tmp_path_factory.mktemp("ops-daemon")
    policies = tmp_path / "policies"
    write(policies, "ops.yaml", POLICY)
    with running_daemon(tmp_path, policies_dir=policies) as d:
        yield d


def _session(d: RunningDaemon) -> tuple[str, Path]:
    sid = d.client.post("/v1/sessions", json={}).json()["id"]
    return sid, d.state_dir / "workspaces" / sid


def _shell(d: RunningDaemon, line: str, sid: str | None = None) -> dict[str, Any]:
    r = d.invoke("shell", {"command": line}, session=sid)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.docker
def test_lines_sh_reads_differently_are_refused(daemon: RunningDaemon) -> None:
    for line in ATTACKS:
        body = _shell(daemon, line)
        assert body["status"] == "denied", (line, body)
        assert body["policy"]["rule"] == "tools.shell.operators", (line, body)
        assert "uid=" not in body["stdout"]
        assert "without a shell" in body["message"], body["message"]


@pytest.mark.docker
def test_pipes_sequencing_and_redirects_run_as_parsed(daemon: RunningDaemon) -> None:
    sid, ws = _session(daemon)
    body = _shell(daemon, "seq 3 | sort -r > out.txt; cat out.txt && echo ok || echo no\n"
                          "cat missing 2>/dev/null || echo 'no file; | && #'", sid)
    assert body["status"] == "ok", body
    assert body["stdout"] == "3\n2\n1\nok\nno file; | && #\n", body
    assert (ws / "out.txt").read_text() == "3\n2\n1\n"
    body = _shell(daemon, "echo err 1>&2 2>/dev/null | wc -c; false", sid)
    assert (body["status"], body["stdout"], body["stderr"]) == ("error", "0\n", "err\n"), body
    assert body["termination"]["exit_code"] == 1
    # the plan, not a shell: `echo` is the program, so `$` and globs in quotes stay literal
    body = _shell(daemon, "echo '$HOME' '*' >> out.txt; head -n 1 out.txt; tr a-z A-Z <out.txt"
                          " | cat", sid)
    assert body["stdout"] == "3\n3\n2\n1\n$HOME *\n", body


@pytest.mark.docker
def test_redirects_stay_in_the_workspace(daemon: RunningDaemon) -> None:
    sid, ws = _session(daemon)
    os.symlink("/etc/passwd", ws / "passwd")
    os.symlink("/tmp", ws / "tmpdir")
    for line in ("cat < passwd", "echo x > passwd", "echo x > tmpdir/x", "echo x >> passwd"):
        body = _shell(daemon, line, sid)
        assert body["status"] == "error", (line, body)
        assert "symbolic link" in body["stderr"], (line, body)
        assert "root:" not in body["stdout"]
    for line in ("echo x > /etc/x", "cat < /etc/passwd", "echo x > ../x", "echo x > /tmp/x"):
        body = _shell(daemon, line, sid)
        assert body["status"] == "denied", (line, body)
        assert "Redirects may name files in the workspace" in body["message"]
    body = _shell(daemon, "echo in > /workspace/sub.txt; cat < sub.txt", sid)
    assert (body["status"], body["stdout"]) == ("ok", "in\n"), body
