"""`sandboxd policy replay` and `sandboxd policy suggest` on an audit log recorded by a real
daemon: two clients (tokens), python with imports, shell commands in containers, file tools,
denied calls and one call too long to be recorded whole."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sandboxd.access.tokens import add_token
from sandboxd.audit import AuditLog
from sandboxd.policy import PolicyStore
from tests.support import cli
from tests.support.daemon import RunningDaemon, running_daemon

REPO = Path(__file__).resolve().parents[2]
DEFAULT = REPO / "policies" / "default.yaml"


def sandboxd(*args: str) -> subprocess.CompletedProcess[str]:
    return cli.run(*args, env={"PATH": "/usr/bin:/bin",
                               "SANDBOXD_CONFIG": "/nonexistent/sandboxd.yaml"})


def policies(tmp_path: Path, name: str, text: str) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "policy.yaml").write_text(text)
    return directory


Call = tuple[str, str, str, dict[str, Any], str]  # client, label, tool, arguments, status


def make_calls(daemon: RunningDaemon, tokens: dict[str, str], calls: list[Call]
               ) -> dict[str, str]:
    """Make each call as its client; check its status; ``{label: request id}``."""
    ids: dict[str, str] = {}
    for client, label, tool, arguments, status in calls:
        r = httpx.post(f"{daemon.url}/v1/tools/{tool}/invoke", json={"arguments": arguments},
                       headers={"Authorization": f"Bearer {tokens[client]}"}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["status"] == status, (label, r.json())
        ids[label] = r.json()["id"]
    return ids


def record_log(tmp_path: Path
               ) -> tuple[Path, dict[str, str], list[Call], dict[str, str]]:
    """A mix of calls from alice and bob: the audit log, ``{label: request id}``, the calls
    and the clients' tokens."""
    tokens_file = tmp_path / "tokens.yaml"
    tokens = {"alice": add_token(tokens_file, "alice"), "bob": add_token(tokens_file, "bob")}
    calls: list[Call] = [
        ("alice", "json_math", "python",
         {"code": "import json, math\nprint(json.dumps(math.pi))"}, "ok"),
        ("alice", "csv", "python", {"code": "import csv\nimport statistics\nprint(1)"}, "ok"),
        ("alice", "ls", "shell", {"command": "ls"}, "ok"),
        ("alice", "echo", "shell", {"command": "echo hi"}, "ok"),
        ("alice", "write", "write_file", {"path": "a.txt", "content": "x"}, "ok"),
        # allowed; a call without a session gets a fresh workspace: no such file
        ("alice", "read", "read_file", {"path": "a.txt"}, "error"),
        ("alice", "list", "list_files", {"path": "."}, "ok"),
        ("alice", "curl", "shell", {"command": "curl x"}, "denied"),
        # an admin-defined tool (allowed; a fresh workspace is no git repository)
        ("alice", "git_status", "git_status", {}, "error"),
        ("bob", "bob_csv", "python", {"code": "import csv\nprint(2)"}, "ok"),
        ("bob", "date", "shell", {"command": "date"}, "ok"),
        ("bob", "os", "python", {"code": "import os"}, "denied"),
        # longer than an audit preview: its arguments are not in the log whole
        ("bob", "long", "python", {"code": "import csv\n" + "#" * 2000}, "ok"),
        # a secret-looking value: redacted in the log
        ("bob", "secret", "shell", {"command": "echo password=hunter22"}, "ok"),
    ]
    # a small audit file: the log rotates, and replay reads the rotated files first
    env = {"SANDBOXD_TOKENS_FILE": str(tokens_file), "SANDBOXD_AUDIT_MAX_BYTES": "8192"}
    with running_daemon(tmp_path, env=env, token=tokens["alice"]) as d:
        ids = make_calls(d, tokens, calls)
    return d.audit_path, ids, calls, tokens


@pytest.mark.docker
def test_replay_and_suggest_on_a_recorded_log(tmp_path: Path) -> None:
    audit, ids, calls, tokens = record_log(tmp_path)
    default = DEFAULT.read_text()
    assert (audit.parent / "audit.jsonl.2").exists()
    # stricter: csv may not be imported, echo may not run (deny beats allow), shell commands
    # get 30 s, a file is written only once a person says yes
    stricter = default.replace("deny: [os, sys,", "deny: [csv, os, sys,").replace(
        "deny: [curl, wget,", "deny: [echo, curl, wget,").replace(
        "    operators: false\n", "    operators: false\n    limits: {timeout: 30s}\n").replace(
        "  write_file:\n", "  write_file:\n    approve: {by: [lead]}\n")
    assert stricter.count("deny: [csv,") == 1 and stricter.count("deny: [echo,") == 1
    assert stricter.count("timeout: 30s") == 1 and stricter.count("approve:") == 1
    strict_dir = policies(tmp_path, "stricter", stricter)
    same_dir = policies(tmp_path, "same", default)

    # the state directory: the log found in it
    r = sandboxd("policy", "replay", "--audit", str(audit.parent), "--policies", str(strict_dir),
                 "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["calls"] == 14
    assert out["counts"] == {"allowed → denied": 3, "denied → allowed": 0,
                             "needs approval": 1, "no longer needs approval": 0,
                             "limits changed": 2, "undecidable": 2}
    assert [(c["request_id"], c["rule"], c["detail"]) for c in out["changes"]
            if c["kind"] == "needs approval"] == [
        (ids["write"], "tools.write_file.approve", "approvers: lead")]
    refused = {c["request_id"]: (c["client"], c["rule"], c["was_rule"])
               for c in out["changes"] if c["kind"] == "allowed → denied"}
    assert refused == {
        ids["csv"]: ("alice", "tools.python.imports.deny[0]", "tools.python"),
        ids["bob_csv"]: ("bob", "tools.python.imports.deny[0]", "tools.python"),
        ids["echo"]: ("alice", "tools.shell.commands.deny[0]",
                      "tools.shell.commands.allow[6]"),
    }
    undecidable = [c for c in out["changes"] if c["kind"] == "undecidable"]
    assert [(c["request_id"], c["rule"]) for c in undecidable] == [
        (ids["long"], "arguments cut in the record (too long to record whole)"),
        (ids["secret"], "arguments redacted in the record (a value looked like a secret)")]
    assert {c["request_id"]: (c["client"], c["detail"]) for c in out["changes"]
            if c["kind"] == "limits changed"} == {
        ids["ls"]: ("alice", "timeout_s 60 → 30"), ids["date"]: ("bob", "timeout_s 60 → 30")}
    assert out["unchanged"] == 6
    assert {(x["client"], x["kind"], x["count"]) for x in out["by_client"]} == {
        ("alice", "allowed → denied", 2), ("bob", "allowed → denied", 1),
        ("alice", "needs approval", 1),
        ("alice", "limits changed", 1), ("bob", "limits changed", 1), ("bob", "undecidable", 2)}
    assert {(x["rule"], x["count"]) for x in out["by_rule"]
            if x["kind"] == "allowed → denied"} == {
        ("tools.python.imports.deny[0]", 2), ("tools.shell.commands.deny[0]", 1)}
    # the same as text, per rule and client
    r = sandboxd("policy", "replay", "--audit", str(audit), "--policies", str(strict_dir))
    assert r.returncode == 1
    assert r.stdout.splitlines()[0] == (
        f"14 decided call(s) in {audit}: 3 allowed → denied, 0 denied → allowed, "
        "1 needs approval, 0 no longer needs approval, 2 limits changed, 2 undecidable, "
        "6 unchanged")
    assert "      2  allowed → denied  tools.python.imports.deny[0]" in r.stdout
    assert "      1  allowed → denied  bob" in r.stdout
    assert f"  {ids['ls']}  client=alice  tool=shell  tools.shell.commands.allow[0] (was " \
           "tools.shell.commands.allow[0]): timeout_s 60 → 30" in r.stdout

    # under the policy that made the decisions: nothing changes; the cut call is still
    # unknown (exit 3), and without it (alice's calls) the answer is a plain 0
    r = sandboxd("policy", "replay", "--audit", str(audit), "--policies", str(same_dir))
    assert r.returncode == 3, r.stdout + r.stderr
    r = sandboxd("policy", "replay", "--audit", str(audit), "--policies", str(same_dir),
                 "--client", "alice", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["unchanged"] == 9 and json.loads(r.stdout)["changes"] == []

    # a least-privilege policy for alice
    suggested = tmp_path / "suggested" / "alice.yaml"
    suggested.parent.mkdir()
    r = sandboxd("policy", "suggest", "--audit", str(audit), "--client", "alice",
                 "-o", str(suggested))
    assert r.returncode == 0, r.stdout + r.stderr
    r = sandboxd("policy", "check", str(suggested))
    assert r.returncode == 0, r.stdout + r.stderr
    spec = yaml.safe_load(suggested.read_text())
    assert spec["clients"] == ["alice"]
    assert sorted(spec["tools"]) == ["list_files", "python", "read_file", "shell",
                                     "write_file"]
    assert sorted(spec["tools"]["python"]["imports"]["allow"]) == ["csv", "json", "math",
                                                                    "statistics"]
    assert spec["tools"]["shell"]["commands"]["allow"] == ["echo", "ls"]
    assert spec["tools"]["read_file"]["paths"]["allow"] == ["a.txt"]
    assert spec["limits"] == {"timeout": "60s", "memory": "256Mi", "cpus": 1, "pids": 64,
                              "output": "1Mi", "open_files": 64}  # what the calls got
    # the admin-defined tool it used: its definition in force, copied
    assert spec["custom_tools"]["git_status"]["argv"] == ["git", "status", "--short"]
    assert "# shell: 1 denied call(s) seen" in suggested.read_text()
    r = sandboxd("policy", "replay", "--audit", str(audit), "--policies",
                 str(suggested.parent), "--client", "alice")
    assert r.returncode == 0, r.stdout + r.stderr
    # in force: a daemon with the suggested policy runs alice's calls as before
    again = tmp_path / "again"
    again.mkdir()
    with running_daemon(again, policies_dir=suggested.parent, token=tokens["alice"],
                        env={"SANDBOXD_TOKENS_FILE": str(tmp_path / "tokens.yaml")}) as d:
        make_calls(d, tokens, [c for c in calls if c[0] == "alice"])
    # stricter than the default: bob (no policy names him) is refused everything he did
    r = sandboxd("policy", "replay", "--audit", str(audit), "--policies",
                 str(suggested.parent), "--client", "bob", "--json")
    assert r.returncode == 1
    assert json.loads(r.stdout)["counts"]["allowed → denied"] == 2


def test_replay_warns_of_an_altered_log(tmp_path: Path) -> None:
    """A record edited after the fact is replayed as it stands, and the replay says so."""
    store = PolicyStore(None)
    store.load()
    log_path = tmp_path / "audit.jsonl"
    with AuditLog(log_path) as log:
        for i, code in enumerate(("import json", "import os", "import math")):
            log.decision(request_id=f"inv_{i}", client="local", tool="python", session=None,
                         arguments={"code": code},
                         decision=store.decide("local", "python", {"code": code}, None))
    r = sandboxd("policy", "replay", "--audit", str(log_path), "--json")
    assert (r.returncode, r.stderr) == (0, ""), r.stdout + r.stderr
    assert json.loads(r.stdout)["unchanged"] == 3
    # the denial, edited into an allow (a record the chain's next record pins)
    log_path.write_text(log_path.read_text().replace('"decision":"deny"', '"decision":"allow"'))
    r = sandboxd("policy", "replay", "--audit", str(log_path), "--json")
    assert r.returncode == 1
    assert r.stderr.startswith("sandboxd: warning: the audit log does not verify, its records "
                               f"may have been altered: {log_path}:2 (seq 1)")
    changes = json.loads(r.stdout)["changes"]
    assert [(c["request_id"], c["kind"]) for c in changes] == [("inv_1", "allowed → denied")]


def test_replay_bad_input_is_one_line(tmp_path: Path) -> None:
    r = sandboxd("policy", "replay", "--audit", str(tmp_path / "nope.jsonl"))
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f"sandboxd: {tmp_path / 'nope.jsonl'}: no such audit log"]
    (tmp_path / "audit.jsonl").write_text("")
    r = sandboxd("policy", "replay", "--audit", str(tmp_path))
    assert (r.returncode, r.stderr) == (0, "")  # an empty log: nothing to change
    broken = policies(tmp_path, "broken", "version: 1\nname: x\nclients: ['*']\ntools:\n"
                                          "  shell: {operators: maybe}\n")
    r = sandboxd("policy", "replay", "--audit", str(tmp_path), "--policies", str(broken))
    assert r.returncode == 2
    assert r.stderr.startswith(f"{broken / 'policy.yaml'}:5:")
