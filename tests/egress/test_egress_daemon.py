"""Egress through the real daemon: a sandbox reaches what its policy allows on the fake
internet (:mod:`tests.support.fakenet`) through the daemon's proxy and nothing else; every
attempt is an audit record and a counter."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import cli
from tests.support.egress import SECRET, EgressLab, egress_lab

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def lab(docker_client: Any) -> Iterator[EgressLab]:
    with egress_lab() as running:
        yield running


def _get(url: str, ctx: bool = False) -> str:
    """Python for a sandbox: GET ``url`` with urllib; its value is the body or the error."""
    return ("import urllib.request, urllib.error\n"
            "try:\n"
            f"    r = urllib.request.urlopen({url!r}, timeout=30{', context=ctx' if ctx else ''})\n"
            "    out = ['ok', r.read().decode()]\n"
            "except urllib.error.HTTPError as e:\n"
            "    out = ['refused', e.code, e.reason, e.read().decode()]\n"
            "except OSError as e:\n"
            "    out = ['error', str(e)]\n"
            "out")


def test_allowed_http_and_https_work_and_are_audited(lab: EgressLab) -> None:
    net = lab.net
    body = lab.py(_get(f"http://api.test:{net.http_port}/plain"))
    assert body["value"] == ["ok", "hello from api /plain\n"], body
    record = lab.wait_egress(host="api.test", path="/plain")
    assert record["verdict"] == "allowed" and record["method"] == "GET"
    assert record["rule"] == f"egress.allow: api.test:{net.http_port}"
    assert record["port"] == net.http_port and record["address"] == "127.1.2.10"
    assert record["bytes_out"] > 0 and record["bytes_in"] > 0
    assert record["sandbox"].startswith(f"sandboxd-{lab.instance}-")
    body = lab.py(lab.ca_code() + _get(f"https://api.test:{net.https_port}/tls", ctx=True))
    assert body["value"] == ["ok", "hello from api-tls /tls\n"], body
    record = lab.wait_egress(host="api.test", port=net.https_port, method="CONNECT")
    assert record["verdict"] == "allowed" and record["bytes_in"] > 0
    # the sandbox resolved nothing: the proxy asked the fake DNS server for the name
    assert ("api.test", "A") in net.questions


def test_a_forbidden_host_is_refused_naming_the_rule(lab: EgressLab) -> None:
    net = lab.net
    body = lab.py(_get(f"http://forbidden.test:{net.http_port}/"))
    kind, code, reason, text = body["value"]
    assert (kind, code) == ("refused", 403), body
    why = f"no egress.allow entry of policy 'egress' matches forbidden.test:{net.http_port}"
    assert why in reason and why in text, body
    body = lab.py(lab.ca_code() + _get(f"https://forbidden.test:{net.https_port}/", ctx=True))
    assert body["value"][0] == "error" and "403" in body["value"][1], body
    assert why.replace(str(net.http_port), str(net.https_port)) in body["value"][1], body
    record = lab.wait_egress(host="forbidden.test", method="CONNECT")
    assert record["verdict"] == "denied" and record["rule"] == "egress.allow (default deny)"
    assert record["bytes_out"] == 0 and record["address"] is None
    assert net.requests("forbidden") == [] and net.requests("forbidden-tls") == []
    # never resolved either: a refused name does not leave the proxy
    assert not [q for q in net.questions if q[0] == "forbidden.test"]


def test_method_and_path_rules_apply_to_plain_http(lab: EgressLab) -> None:
    net = lab.net
    ok = lab.py(_get(f"http://other.test:{net.http_port}/v1/models"))
    assert ok["value"][0] == "ok", ok
    no = lab.py(_get(f"http://other.test:{net.http_port}/v2/models"))
    assert no["value"][:2] == ["refused", 403], no
    assert "GET /v2/models on other.test" in no["value"][2], no
    # HTTPS to a host allowed only for some paths: the proxy cannot see them in a tunnel
    tls = lab.py(lab.ca_code() + _get(f"https://other.test:{net.https_port}/v1/", ctx=True))
    assert tls["value"][0] == "error" and "inside a TLS tunnel" in tls["value"][1], tls


def test_the_shell_tool_and_a_session_use_the_proxy_too(lab: EgressLab) -> None:
    net = lab.net
    r = lab.d.invoke("shell", {"command": "python3 -c 'import urllib.request as u; print(u."
                              f"urlopen(\"http://api.test:{net.http_port}/sh\").read().decode().strip())'"})
    assert r.json()["stdout"] == "hello from api /sh\n", r.text
    session = lab.d.client.post("/v1/sessions").json()["id"]
    for n in range(2):  # the session's container keeps its proxy between calls
        body = lab.py(_get(f"http://api.test:{net.http_port}/s{n}"), session=session)
        assert body["value"] == ["ok", f"hello from api /s{n}\n"], body
    assert lab.wait_egress(path="/s1", session=session)["verdict"] == "allowed"
    assert lab.d.client.delete(f"/v1/sessions/{session}").status_code == 204


def test_audit_tail_and_metrics_show_egress(lab: EgressLab) -> None:
    net = lab.net
    lab.py(_get(f"http://api.test:{net.http_port}/tail"))
    lab.py(_get(f"http://forbidden.test:{net.http_port}/tail"))
    lab.wait_egress(host="forbidden.test", path="/tail")
    out = cli.run("audit", "tail", "--event", "egress", "-n", "50", "--json",
                  str(lab.d.audit_path))
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert {r["event"] for r in records} == {"egress"}, out.stdout
    assert {(r["host"], r["verdict"]) for r in records if r["path"] == "/tail"} == {
        ("api.test", "allowed"), ("forbidden.test", "denied")}, out.stdout
    text = cli.run("audit", "tail", "--event", "egress", str(lab.d.audit_path)).stdout
    assert "forbidden.test" in text, text
    metrics = lab.metrics()
    allowed = [ln for ln in metrics.splitlines()
               if ln.startswith('sandboxd_egress_connections_total{verdict="allowed"}')]
    denied = [ln for ln in metrics.splitlines()
              if ln.startswith('sandboxd_egress_connections_total{verdict="denied"}')]
    assert allowed and float(allowed[0].split()[-1]) >= 1, metrics
    assert denied and float(denied[0].split()[-1]) >= 1, metrics
    assert 'sandboxd_egress_bytes_total{direction="in"}' in metrics


def test_a_secret_header_reaches_the_server_and_never_the_sandbox(lab: EgressLab) -> None:
    net = lab.net
    out = lab.py(f"""\
import json, os, urllib.request, urllib.error
body = urllib.request.urlopen("https://secret.test:{net.https_port}/headers",
                              timeout=30).read().decode()
try:
    urllib.request.urlopen(urllib.request.Request(
        "https://secret.test:{net.https_port}/headers", data=b"x", method="POST"), timeout=30)
    post = "sent"
except urllib.error.HTTPError as e:
    post = [e.code, e.reason]
seen = []
for name in sorted(os.listdir("/run/sandboxd")):
    try:
        seen.append(open("/run/sandboxd/" + name, "rb").read().decode("latin-1"))
    except OSError:
        pass
[json.loads(body), post, json.dumps(dict(os.environ)), "\\n".join(seen)]""")
    assert out["status"] == "ok", out
    echoed, post, env, files = out["value"]
    sent = [r for r in net.requests("api-tls") if r["path"] == "/headers"]
    assert len(sent) == 1 and sent[0]["headers"]["X-Api-Key"] == f"Token {SECRET}", sent
    # the server echoed it back: masked on the way to the sandbox
    assert echoed["X-Api-Key"] == "*" * len(f"Token {SECRET}"), echoed
    assert SECRET not in env and SECRET not in files and SECRET not in json.dumps(out)
    assert "PRIVATE KEY" not in files and "BEGIN CERTIFICATE" in files  # the CA's cert only
    # method/path rules apply inside the terminated tunnel (a POST is outside GET /)
    assert post[0] == 403 and "POST /headers on secret.test" in post[1], post
    record = lab.wait_egress(host="secret.test", method="GET", path="/headers")
    assert record["verdict"] == "allowed" and record["rule"].endswith("GET /")
    assert lab.wait_egress(host="secret.test", method="POST")["verdict"] == "denied"
    assert SECRET not in lab.d.audit_path.read_text()
