"""A real daemon with an egress policy in front of the fake internet (:mod:`.fakenet`), for
the egress tests and their bypass suite."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.fakenet import ALLOWED_NET, FakeNet, fake_internet
from tests.support.scale import time_bound
from tests.support.wait import wait_until

POLICY = """\
version: 1
name: egress
clients: ["*"]
limits: {{timeout: 120s, max_timeout: 180s, memory: 256Mi, pids: 64, output: 1Mi}}
tools:
  python:
    backend: container
    imports: {{allow: ["*"]}}
    egress:
      allow:
        - "api.test:{http}"
        - "api.test:{https}"
        - "other.test:{https} GET /v1/"
        - "other.test:{http} GET /v1/"
        - "rebind-loopback.test:{http}"
        - "rebind-bridge.test:{http}"
        - "rebind-metadata.test:{http}"
        - "secret.test:{https} GET /"
        - "index.test:{https}"
        - "{net}:{http}"
        - "{net}:{https}"
      secrets:
        secret.test: {{header: X-Api-Key, env: EGRESS_TEST_SECRET, prefix: "Token "}}
  shell:
    backend: container
    commands: {{allow: [python3, cat, curl]}}
    egress:
      allow: ["api.test:{http}", "{net}:{http}", "secret.test:{https} GET /", "{net}:{https}"]
      secrets:
        secret.test: {{header: X-Api-Key, env: EGRESS_TEST_SECRET, prefix: "Token "}}
"""


#: how long a connection's record may take to appear once it ended (120 s under the VM's
#: emulation, where a loaded host slows everything by a factor no bound can know)
RECORD_S = time_bound(30.0, emulated_s=120.0)
#: the value of the lab's secret header (the daemon's environment holds it; sandboxes never)
SECRET = f"s3cr3t-{secrets.token_hex(8)}"


@dataclass
class EgressLab:
    """The daemon (``d``), its fake internet (``net``) and its Docker instance label."""

    d: RunningDaemon
    net: FakeNet
    instance: str
    policy_path: Path

    def py(self, code: str, session: str | None = None) -> dict[str, Any]:
        """A python call in a sandbox; its result body."""
        body: dict[str, Any] = {"session": session} if session else {}
        r = self.d.invoke("python", {"code": code}, **body)
        assert r.status_code == 200, r.text
        return r.json()

    def egress(self, **match: Any) -> list[dict[str, Any]]:
        """The egress audit records whose fields equal ``match``."""
        return [r for r in audit_records(self.d.audit_path, "egress")
                if all(r.get(k) == v for k, v in match.items())]

    def wait_egress(self, **match: Any) -> dict[str, Any]:
        """The first egress record matching ``match`` (waited for: a connection's record is
        written when it ends)."""
        return wait_until(lambda: next(iter(self.egress(**match)), None), timeout=RECORD_S,
                          what=f"an egress audit record with {match}")

    def ca_code(self) -> str:
        """Python that makes ``ctx``: an SSL context trusting the fake internet's CA."""
        pem = self.net.ca.pem().decode()
        return f"import ssl\nctx = ssl.create_default_context(cadata={pem!r})\n"

    def metrics(self) -> str:
        return self.d.client.get("/metrics").text


@contextlib.contextmanager
def egress_lab(env: dict[str, str] | None = None) -> Iterator[EgressLab]:
    """Start the fake internet and a daemon whose policy allows parts of it."""
    where = Path(tempfile.mkdtemp(prefix="egr-"))  # short: runner sockets must fit 108 bytes
    try:
        with fake_internet(where) as net:
            policies = where / "policies"
            policies.mkdir()
            (policies / "egress.yaml").write_text(POLICY.format(
                http=net.http_port, https=net.https_port, net=ALLOWED_NET))
            instance = f"egr{secrets.token_hex(4)}"
            daemon_env = {"SANDBOXD_INSTANCE": instance, "SANDBOXD_WARM_POOL_SIZE": "0",
                          "SANDBOXD_EGRESS_RESOLVER": net.resolver,
                          "SANDBOXD_EGRESS_UPSTREAM_CA": str(net.ca.write(where)),
                          "EGRESS_TEST_SECRET": SECRET, **(env or {})}
            for name in ("SANDBOXD_PYTHON_IMAGE", "SANDBOXD_SHELL_IMAGE"):
                if name in os.environ:
                    daemon_env[name] = os.environ[name]
            with running_daemon(where, policies_dir=policies, env=daemon_env) as d:
                d.client.timeout = httpx.Timeout(240.0)
                yield EgressLab(d, net, instance, policies / "egress.yaml")
    finally:
        shutil.rmtree(where, ignore_errors=True)
