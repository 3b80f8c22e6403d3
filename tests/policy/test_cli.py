"""`sandboxd policy check` and `sandboxd policy explain`, run as real subprocesses."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.policy.helpers import write
from tests.support import cli

REPO = Path(__file__).resolve().parents[2]


def sandboxd(*args: str) -> subprocess.CompletedProcess[str]:
    return cli.run(*args, cwd=REPO,
                   env={"PATH": "/usr/bin:/bin", "HOME": str(REPO),
                        "SANDBOXD_CONFIG": "/nonexistent/sandboxd.yaml"})


def test_check_shipped_policies_ok() -> None:
    r = sandboxd("policy", "check", "policies", "policies/examples/datascience.yaml",
                 "policies/examples/custom-tools.yaml")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == ("policies/default.yaml: ok (policy 'default'; clients: *; tools: python, "
                        "shell, read_file, write_file, list_files, git_status)")
    assert len(lines) == 4


def test_check_bad_file_exit_1_one_line_per_problem(tmp_path: Path) -> None:
    bad = write(tmp_path, "bad.yaml", """\
        version: 1
        name: bad
        clients: ["*"]
        tools:
          shell:
            operators: maybe
            commands: {allow: [ls], deny: [curl], alow: [x]}
        """)
    r = sandboxd("policy", "check", str(bad))
    assert r.returncode == 1
    assert r.stdout.splitlines() == [
        f"{bad}:6:16: tools.shell.operators: Input should be a valid boolean, unable to "
        "interpret input",
        f"{bad}:7:43: tools.shell.commands: unknown key 'alow' (expected one of: allow, deny)",
    ]


def test_check_separately_vs_as_a_set(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", "version: 1\nname: a\nclients: ['*']\n")
    b = write(tmp_path, "b.yaml", "version: 1\nname: b\nclients: ['*']\n")
    r = sandboxd("policy", "check", str(a), str(b))
    assert r.returncode == 1
    assert r.stdout.strip() == f"{b}:3:11: client '*' is already assigned to policy 'a' ({a})"
    assert sandboxd("policy", "check", "--separately", str(a), str(b)).returncode == 0


def test_explain_denied_curl_names_file_line_and_rule() -> None:
    r = sandboxd("policy", "explain", "--tool", "shell", "--args", '{"command": "curl x"}')
    assert r.returncode == 1, r.stderr  # deny exits 1
    lines = r.stdout.splitlines()
    assert lines[0] == "decision: deny"
    assert lines[2].startswith("rule:     policies/default.yaml:")
    assert lines[2].endswith(": tools.shell.commands.deny[0]")
    line_no = int(lines[2].split(":")[2])
    assert "deny: [curl," in (REPO / "policies/default.yaml").read_text().splitlines()[line_no - 1]
    assert lines[3].startswith("message:  `curl` is not allowed here; allowed commands: ls, cat")


def test_explain_allowed_json_with_limits(tmp_path: Path) -> None:
    d = tmp_path / "pol"
    write(d, "p.yaml", """\
        version: 1
        name: p
        clients: [alice]
        tools:
          python: {limits: {timeout: 30s}}
        """)
    r = sandboxd("policy", "explain", "--tool", "python", "--args", '{"code": "1+1"}',
                 "--client", "alice", "--policies", str(d), "--limits", '{"timeout_s": 5}',
                 "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["allowed"] is True and out["rule"] == "tools.python"
    assert out["limits"]["timeout_s"] == 5
    assert out["location"] == f"{d / 'p.yaml'}:5:3"
    # another client has no policy there
    r = sandboxd("policy", "explain", "--tool", "python", "--args", '{"code": "1"}',
                 "--policies", str(d))
    assert "decision: deny" in r.stdout and "No policy applies to client `local`" in r.stdout


def test_explain_bad_input() -> None:
    r = sandboxd("policy", "explain", "--tool", "shell", "--args", "{not json")
    assert r.returncode == 2 and "--args is not valid JSON" in r.stderr
    r = sandboxd("policy", "explain", "--tool", "shell", "--args", '{"cmd": "ls"}')
    assert r.returncode == 2
    assert "invalid arguments: shell: argument 'cmd'" in r.stderr or "'command'" in r.stderr


def test_check_warnings_and_strict(tmp_path: Path) -> None:
    p = write(tmp_path, "w.yaml", """\
        version: 1
        name: w
        clients: ["*"]
        tools:
          shell:
            commands: {allow: [ls, find, bash], deny: [bash]}
            operators: true
        """)
    r = sandboxd("policy", "check", str(p))
    assert r.returncode == 0
    assert r.stderr.splitlines() == [
        f"{p}:6:28: warning: `find` is able to run commands (-exec): whatever it runs is not "
        "checked against this list (the container is the barrier)",
        f"{p}:7:16: warning: shell operators are enabled: pipes, ';', '&&', '||' and redirects "
        "are executed by sandboxd, without a shell (every program is still checked)",
    ]
    r = sandboxd("policy", "check", "--strict", str(p))
    assert r.returncode == 1 and len(r.stdout.splitlines()) == 2
    r = sandboxd("policy", "check", "--quiet", str(p))
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""


def test_show_policies_tools_and_limits() -> None:
    r = sandboxd("policy", "show", "--policies", "policies")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "policies/default.yaml: policy 'default'; clients: *"
    assert "policies/strict.yaml: policy 'strict'; clients: untrusted" in lines
    r = sandboxd("policy", "show", "--client", "untrusted", "--policies", "policies")
    assert r.stdout.splitlines()[1] == (
        "  python         backend restricted; timeout 5s, memory 128Mi, cpus 0.5, pids 16, "
        "output 64Ki, open_files 64, network no")
    r = sandboxd("policy", "show", "--client", "nobody", "--policies", "policies/examples")
    assert "no policy applies" in r.stdout


def test_check_reports_every_problem_of_a_file_in_one_run(tmp_path: Path) -> None:
    """Schema errors used to hide the semantic checks: both kinds come out together, sorted
    by line."""
    f = write(tmp_path, "bad.yaml", """
        version: 1
        name: bad
        clients: ["*"]
        tools:
          python:
            limits:
              memory: 2Gi
              max_memory: 1Gi
              pids: lots
          shell:
            commands:
              allow: [ls]
            bogus: true
        custom_tools:
          "bad tool":
            description: x
            argv: [ls]
        """)
    r = sandboxd("policy", "check", str(f))
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert [line.split(": ", 1)[0].rsplit(":", 2)[1] for line in lines] == ["8", "10", "14",
                                                                              "16"]
    assert "memory is above max_memory" in lines[0]
    assert "pids" in lines[1] and "unknown key 'bogus'" in lines[2]
    assert "'bad tool' is not a valid tool name" in lines[3]


def test_show_prints_sizes_as_written(tmp_path: Path) -> None:
    d = tmp_path / "policies"
    write(d, "p.yaml", """
        version: 1
        name: p
        clients: ["*"]
        tools:
          python:
            limits: {memory: 256MB, output: 64Ki}
        """)
    r = sandboxd("policy", "show", "--policies", str(d))
    assert r.returncode == 0, r.stderr
    assert "memory 256MB" in r.stdout and "output 64Ki" in r.stdout


def test_explain_says_when_a_requested_limit_was_lowered() -> None:
    r = sandboxd("policy", "explain", "--tool", "python", "--args", '{"code": "1"}',
                 "--limits", '{"timeout_s": 500, "memory_bytes": 1000000}')
    assert r.returncode == 0, r.stderr
    lowered = [line for line in r.stdout.splitlines() if line.startswith("lowered:")]
    assert lowered == ["lowered:  timeout_s requested 500s, granted 60s (the policy's limit)"]
    r = sandboxd("policy", "explain", "--tool", "python", "--args", '{"code": "1"}',
                 "--limits", '{"timeout_s": 500}', "--json")
    assert json.loads(r.stdout)["lowered"] == {"timeout_s": {"requested": 500, "granted": 60.0}}


def test_explain_lists_every_limit_of_the_one_table() -> None:
    from sandboxd.protocol.limits import LIMITS

    r = sandboxd("policy", "explain", "--tool", "python", "--args", '{"code": "1"}',
                 "--policies", "policies")
    assert r.returncode == 0, r.stderr
    (line,) = [line for line in r.stdout.splitlines() if line.startswith("limits:")]
    keys = [item.split()[0] for item in line.removeprefix("limits:").split(", ")]
    assert keys == [info.policy for info in LIMITS.values()] + ["network"]
    assert "open_files 64" in line
