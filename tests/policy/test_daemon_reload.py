"""Hot reload in a running daemon: file change and SIGHUP; a broken file is refused, audited."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from sandboxd.audit import verify
from tests.policy.helpers import write
from tests.support.audit import audit_records
from tests.support.daemon import running_daemon
from tests.support.wait import wait_until

POLICY = """\
version: 1
name: live
clients: ["*"]
tools:
  python: {{}}
  {extra}
"""


def test_reload_on_change_and_refusal_keeps_old_policy(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    write(policies, "live.yaml", POLICY.format(extra=""))
    with running_daemon(tmp_path, policies_dir=policies) as d:
        def tools() -> list[str]:
            return [t["name"] for t in d.client.get("/v1/tools").json()]

        assert tools() == ["python"]
        write(policies, "live.yaml", POLICY.format(extra="list_files: {paths: {allow: ['**']}}"))
        wait_until(lambda: "list_files" in tools(), timeout=20, what="list_files offered")
        # a broken edit: refused with file:line:column, the previous policy stays in force
        write(policies, "live.yaml", POLICY.format(extra="shell: {operators: sometimes}"))
        wait_until(lambda: any(e["event"] == "policy_refused" for e in audit_records(d.audit_path)),
                   timeout=20, what="a policy_refused record")
        assert tools() == ["python", "list_files"]
        refused = next(e for e in audit_records(d.audit_path) if e["event"] == "policy_refused")
        assert refused["errors"][0].startswith(f"{policies / 'live.yaml'}:6:22: "
                                               "tools.shell.operators:")
        # visible to monitoring: /readyz stays ready but says degraded, naming file:line ...
        ready = d.client.get("/readyz")
        assert ready.status_code == 200, ready.text
        body = ready.json()
        assert body["ready"] is True and body["degraded"] == ["policy"]
        assert body["policy"]["ok"] is False
        assert f"{policies / 'live.yaml'}:6:22" in body["policy"]["detail"]
        assert "previous policy stays in force" in body["policy"]["detail"]
        # ... a metric counts it, and the log says it once, readably
        metrics = d.client.get("/metrics").text
        assert 'sandboxd_policy_reloads_total{result="refused"} 1.0' in metrics
        time.sleep(1.5)  # sleep-ok: a window in which the 1 s file watcher must NOT log again
        log_lines = [line for line in d.log().splitlines() if "refused" in line]
        assert len(log_lines) == 1, log_lines
        assert "the previous policy stays in force" in log_lines[0]
        # fixed again, and SIGHUP reloads too
        write(policies, "live.yaml", POLICY.format(extra=""))
        wait_until(lambda: tools() == ["python"], timeout=20, what="the fixed policy in force")
        body = d.client.get("/readyz").json()
        assert body["policy"] == {"ok": True, "detail": None} and body["degraded"] == []
        loaded = sum(e["event"] == "policy_loaded" for e in audit_records(d.audit_path))
        d.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: sum(e["event"] == "policy_loaded"
                               for e in audit_records(d.audit_path)) == loaded + 1,
                   timeout=20, what="a policy_loaded record after SIGHUP")
    assert verify(d.audit_path).ok
