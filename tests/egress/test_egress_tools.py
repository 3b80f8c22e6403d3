"""The tools a sandbox fetches with, through the daemon's egress proxy and its policy: curl
(the shell tool; the proxy variables and the daemon's CA bundle are all it is given) and pip
installing from a package index on the fake internet (:mod:`tests.support.pyindex`); a host
the policy does not allow is refused with the rule that refused it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.egress import SECRET, EgressLab, egress_lab
from tests.support.pyindex import publish

pytestmark = pytest.mark.docker

#: the package the test's index serves, and what importing it gives
PACKAGE, VALUE = "tinyegress", "installed through the egress proxy"


@pytest.fixture(scope="module")
def lab(docker_client: Any) -> Iterator[EgressLab]:
    with egress_lab() as running:
        yield running


def _shell(lab: EgressLab, command: str) -> dict[str, Any]:
    r = lab.d.invoke("shell", {"command": command})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_curl_gets_what_the_policy_allows_and_is_refused_the_rest(lab: EgressLab) -> None:
    p, tls = lab.net.http_port, lab.net.https_port
    ok = _shell(lab, f"curl -sS http://api.test:{p}/curl")
    assert ok["stdout"] == "hello from api /curl\n", ok
    sent = next(r for r in lab.net.requests("api") if r["path"] == "/curl")
    assert sent["headers"]["User-Agent"].startswith("curl/"), sent
    assert lab.wait_egress(host="api.test", path="/curl")["verdict"] == "allowed"
    why = f"no egress.allow entry of policy 'egress' matches forbidden.test:{p}"
    no = _shell(lab, f"curl -sS -i http://forbidden.test:{p}/curl")
    assert no["stdout"].startswith("HTTP/1.1 403 ") and why in no["stdout"], no
    assert "X-Sandboxd-Egress-Rule: egress.allow (default deny)" in no["stdout"], no
    # HTTPS: curl says the tunnel was refused; -v shows the proxy's status line with the rule
    no = _shell(lab, f"curl -sS -v https://forbidden.test:{tls}/curl")
    assert no["termination"]["exit_code"] == 56, no  # curl's "failure receiving data"
    assert "CONNECT tunnel failed, response 403" in no["stderr"], no
    assert why.replace(str(p), str(tls)) in no["stderr"], no
    record = lab.wait_egress(host="forbidden.test", port=tls, method="CONNECT")
    assert record["verdict"] == "denied" and record["rule"] == "egress.allow (default deny)"
    assert lab.net.requests("forbidden") == [] and lab.net.requests("forbidden-tls") == []


def test_curl_sends_a_secret_header_the_sandbox_never_holds(lab: EgressLab) -> None:
    tls = lab.net.https_port
    # no --cacert: curl trusts the daemon's CA through CURL_CA_BUNDLE, as the policy's
    # secrets give it (the proxy terminates TLS to add the header)
    out = _shell(lab, f"curl -sS https://secret.test:{tls}/headers?curl")
    assert out["status"] == "ok", (out["stdout"], out["stderr"])
    echoed = json.loads(out["stdout"])
    assert echoed["X-Api-Key"] == "*" * len(f"Token {SECRET}"), echoed  # masked on the way in
    sent = [r for r in lab.net.requests("api-tls") if r["path"] == "/headers?curl"]
    assert len(sent) == 1 and sent[0]["headers"]["X-Api-Key"] == f"Token {SECRET}", sent
    assert sent[0]["headers"]["User-Agent"].startswith("curl/"), sent
    env = _shell(lab, "python3 -c 'import json, os; print(json.dumps(dict(os.environ)))'")
    seen = json.loads(env["stdout"])
    assert seen["CURL_CA_BUNDLE"] == "/run/sandboxd/egress-ca.pem", seen
    assert seen["https_proxy"] == "http://127.0.0.1:3128", seen
    assert SECRET not in json.dumps(seen) and SECRET not in json.dumps(out)
    record = lab.wait_egress(host="secret.test", path="/headers?curl")
    assert record["verdict"] == "allowed" and record["rule"].endswith("GET /"), record


def _pip(lab: EgressLab, index: str, target: str) -> str:
    """Python for a sandbox: ``pip install`` of the package from ``index`` into ``target``,
    trusting the fake internet's CA (the index's certificate: the tunnel is opaque). The CA
    goes in ``REQUESTS_CA_BUNDLE``, not ``--cert``: the policy's secrets set that variable
    (the daemon's CA bundle) and pip's requests lets it win over ``--cert``."""
    pem = lab.net.ca.pem().decode()
    return f"""\
import os, subprocess, sys
with open("/workspace/fakenet-ca.pem", "w") as f:
    f.write({pem!r})
env = dict(os.environ, REQUESTS_CA_BUNDLE="/workspace/fakenet-ca.pem")
r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-cache-dir", "--no-input",
                    "--disable-pip-version-check", "--retries", "1", "--timeout", "30",
                    "--target", {target!r}, "--index-url", {index!r}, {PACKAGE!r}],
                   capture_output=True, text=True, timeout=300, env=env)
out = [r.returncode, r.stdout + r.stderr]
"""


def test_pip_installs_from_an_allowed_index_and_not_from_another(lab: EgressLab) -> None:
    tls = lab.net.https_port
    wheel = publish(lab.net, PACKAGE, "1.0", f"VALUE = {VALUE!r}\n")
    body = lab.py(_pip(lab, f"https://index.test:{tls}/simple/", "/workspace/site") + f"""\
try:
    sys.path.insert(0, "/workspace/site")
    import {PACKAGE}
    out.append({PACKAGE}.VALUE)
except ImportError as e:
    out.append(repr(e))
out""")
    assert body["status"] == "ok", (body.get("error"), body.get("stderr"), body.get("stdout"))
    code, log, value = body["value"]
    assert code == 0 and f"Successfully installed {PACKAGE}-1.0" in log, log
    assert value == VALUE, value
    paths = [r["path"] for r in lab.net.requests("api-tls")]
    assert f"/simple/{PACKAGE}/" in paths and f"/files/{wheel}" in paths, paths
    record = lab.wait_egress(host="index.test", port=tls, method="CONNECT")
    assert record["verdict"] == "allowed" and record["bytes_in"] > 0, record
    # the same install from an index host the policy does not name
    body = lab.py(_pip(lab, f"https://forbidden-index.test:{tls}/simple/", "/workspace/no")
                  + "out")
    code, log = body["value"]
    assert code != 0 and f"No matching distribution found for {PACKAGE}" in log, log
    assert "Tunnel connection failed: 403" in log and \
        f"no egress.allow entry of policy 'egress' matches forbidden-index.test:{tls}" in log, log
    record = lab.wait_egress(host="forbidden-index.test", port=tls)
    assert record["verdict"] == "denied" and record["rule"] == "egress.allow (default deny)"
    assert lab.net.requests("forbidden-tls") == []
