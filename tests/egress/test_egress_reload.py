"""A policy reload reaches egress at once: open connections to a host the new policy no
longer allows are cut (audited as such), new ones follow the new rules."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from tests.support.egress import RECORD_S, egress_lab
from tests.support.wait import wait_until

pytestmark = pytest.mark.docker


def test_a_reload_cuts_connections_to_a_removed_host(docker_client: Any) -> None:
    with egress_lab() as lab:
        port = lab.net.https_port
        session = lab.d.client.post("/v1/sessions").json()["id"]
        # a TLS connection to api.test kept open in the session's kernel
        opened = lab.py(lab.ca_code() + f"""\
import socket
raw = socket.create_connection(("127.0.0.1", 3128), timeout=30)
raw.sendall(b"CONNECT api.test:{port} HTTP/1.1\\r\\n\\r\\n")
assert raw.recv(4096).startswith(b"HTTP/1.1 200")
KEPT = ctx.wrap_socket(raw, server_hostname="api.test")
KEPT.version()""", session=session)
        assert opened["value"] and opened["value"].startswith("TLS"), opened
        text = lab.policy_path.read_text()
        lab.policy_path.write_text(text.replace(f'        - "api.test:{port}"\n', "", 1))
        lab.d.proc.send_signal(signal.SIGHUP)
        cut = lab.wait_egress(host="api.test", port=port, method="CONNECT")
        assert cut["verdict"] == "allowed" and "the policy no longer allows it" in cut["cut"]
        after = lab.py("""\
KEPT.settimeout(10)
try:
    got = KEPT.recv(1)
    state = "closed" if got == b"" else "open"
except OSError as e:
    state = "closed: " + type(e).__name__
state""", session=session)
        assert after["value"].startswith("closed"), after
        again = lab.py(lab.ca_code() + f"""\
import urllib.request, urllib.error
try:
    urllib.request.urlopen("https://api.test:{port}/", timeout=20, context=ctx)
    out = "reached"
except OSError as e:
    out = str(e)
out""", session=session)
        assert "403" in again["value"] and f"matches api.test:{port}" in again["value"], again
        wait_until(lambda: lab.egress(host="api.test", port=port, verdict="denied") or None,
                   timeout=RECORD_S, what="the refused new connection's record")
