"""The ``egress:`` policy block: entries, errors at file:line:col, the restricted backend's
refusal, what ``policy explain`` shows, the decision rules the proxy applies, and where a
secret's value may come from and how it is kept from answers."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from sandboxd.egress.decide import check_address, check_target, same_host
from sandboxd.egress.rules import EgressSpec, SecretSpec, parse_entry
from sandboxd.egress.tls import SecretUnavailable, masked, secret_value
from sandboxd.egress.wire import BadRequest, client_hello_sni, parse_head
from sandboxd.policy import load_file
from tests.policy.helpers import write
from tests.support import cli


def _problems(path: Path) -> list[str]:
    policy, problems = load_file(path, str(path))
    assert policy is None
    return problems


def test_entries_parse_hosts_suffixes_addresses_methods_and_paths() -> None:
    rule = parse_entry("api.example.com:443 GET,POST /v1/")
    assert (rule.host, rule.port, rule.methods, rule.path) == (
        "api.example.com", 443, frozenset({"GET", "POST"}), "/v1/")
    assert rule.matches_request("GET", "/v1/models") and not rule.matches_request("PUT", "/v1/")
    assert not rule.matches_request("GET", "/v2/")
    wild = parse_entry("*.pypi.org:443")
    assert wild.matches_name("files.pypi.org", 443) and not wild.matches_name("pypi.org", 443)
    assert not wild.matches_name("evilpypi.org", 443) and not wild.matches_name("x.pypi.org", 80)
    net = parse_entry("10.1.2.0/24:8080")
    assert net.matches_address(ipaddress.ip_address("10.1.2.9"), 8080)
    assert not net.matches_name("10.1.2.9", 8080)  # a host rule never matches an address
    assert parse_entry("[2001:db8::/32]:443").network == ipaddress.ip_network("2001:db8::/32")


def test_bad_entries_and_misplaced_egress_are_errors_at_their_position(tmp_path: Path) -> None:
    p = write(tmp_path, "p.yaml", """\
        version: 1
        name: p
        clients: ["*"]
        tools:
          python:
            backend: restricted
            egress: {allow: ["api.test:443"]}
          shell:
            backend: container
            network: lab
            egress:
              allow:
                - "api.test"
                - "api.test:443 FETCH"
                - "10.0.0.1/8:80"
              secrets:
                other.test: {header: X-Key, env: KEY}
                api.test: {header: X-Key}
        """)
    problems = _problems(p)
    assert f"{p}:13:11: tools.shell.egress.allow[0]: 'api.test' is not an egress entry: " \
           "write HOST:PORT [METHODS] [/PATH] (e.g. 'api.example.com:443 GET,POST /v1/') or " \
           "CIDR:PORT" in problems
    assert any(x.startswith(f"{p}:14:11: tools.shell.egress.allow[1]: ") and "FETCH" in x
               for x in problems), problems
    assert any(x.startswith(f"{p}:15:11: tools.shell.egress.allow[2]: ") and "CIDR" in x
               for x in problems), problems
    assert any(x.startswith(f"{p}:18:19: tools.shell.egress.secrets.api.test: ")
               and "env or file" in x for x in problems), problems
    p2 = write(tmp_path, "q.yaml", """\
        version: 1
        name: q
        clients: ["*"]
        tools:
          python:
            backend: restricted
            egress: {allow: ["api.test:443"]}
          shell:
            backend: container
            network: lab
            egress:
              allow: ["api.test:443"]
              secrets:
                other.test: {header: X-Key, env: KEY}
        """)
    assert _problems(p2) == [
        f"{p2}:7:13: tools.python.egress: the restricted backend has no network (its sandbox "
        "may not open sockets); 'python' needs backend: container for egress",
        f"{p2}:12:7: tools.shell.egress: 'shell' has both egress and network 'lab': a Docker "
        "network reaches past the egress proxy; use network: none with egress",
        f"{p2}:14:21: tools.shell.egress.secrets.other.test: secrets for 'other.test', which "
        "no allow entry names exactly",
    ]


def test_policy_explain_shows_what_a_tool_may_reach(tmp_path: Path) -> None:
    d = tmp_path / "pol"
    d.mkdir()
    write(d, "p.yaml", """\
        version: 1
        name: reach
        clients: ["*"]
        egress: {allow: ["*.pypi.org:443"]}
        tools:
          shell:
            backend: container
            commands: {allow: [ls]}
            egress:
              allow: ["api.example.com:443 GET /v1/", "10.1.2.0/24:8080"]
          python: {backend: container, imports: {allow: [json]}}
        """)
    out = cli.run("policy", "explain", "--policies", str(d), "--tool", "shell",
                  "--args", '{"command": "ls"}')
    assert out.returncode == 0, out.stderr
    assert "egress:   api.example.com:443 GET /v1/\negress:   10.1.2.0/24:8080\n" in out.stdout
    out = cli.run("policy", "explain", "--policies", str(d), "--tool", "python",
                  "--args", '{"code": "1"}')  # the policy's block, as the tool has none
    assert "egress:   *.pypi.org:443\n" in out.stdout, out.stdout


def _rules(*entries: str) -> object:
    return EgressSpec(allow=list(entries)).compiled("p")


def test_decisions_name_their_rule() -> None:
    rules = _rules("api.test:443", "docs.test:80 GET /v1/", "10.1.2.0/24:8080")
    ok = check_target(rules, "api.test", 443, "CONNECT", None)  # type: ignore[arg-type]
    assert ok.allowed and ok.rule == "egress.allow: api.test:443"
    no = check_target(rules, "evil.test", 443, "CONNECT", None)  # type: ignore[arg-type]
    assert not no.allowed and "no egress.allow entry of policy 'p' matches evil.test:443" \
        in no.reason
    blind = check_target(rules, "docs.test", 80, "CONNECT", None)  # type: ignore[arg-type]
    assert not blind.allowed and "inside a TLS tunnel" in blind.reason
    assert check_target(rules, "docs.test", 80, "GET", "/v1/x").allowed  # type: ignore[arg-type]
    assert not check_target(rules, "docs.test", 80, "POST", "/v1/x").allowed  # type: ignore[arg-type]
    assert check_target(rules, "10.1.2.3", 8080, "GET", "/").allowed  # type: ignore[arg-type]
    assert not check_target(rules, "10.1.3.3", 8080, "GET", "/").allowed  # type: ignore[arg-type]
    # rebinding: an allowed name answered with a private address no address entry names
    addr, refused = check_address(rules, "api.test", 443,  # type: ignore[arg-type]
                                  [ipaddress.ip_address("169.254.169.254")])
    assert addr is None and refused is not None and "link-local" in refused.reason
    addr, refused = check_address(rules, "api.test", 8080,  # type: ignore[arg-type]
                                  [ipaddress.ip_address("10.1.2.7")])
    assert str(addr) == "10.1.2.7" and refused is None
    assert same_host("api.test", "API.test:443") and not same_host("api.test", "api.test.evil")


def test_request_heads_and_client_hellos_are_parsed_strictly() -> None:
    head = parse_head(b"GET http://api.test:8080/a?b=1 HTTP/1.1\r\nHost: api.test:8080")
    assert (head.host, head.port, head.path) == ("api.test", 8080, "/a?b=1")
    for bad in (b"GET https://api.test/ HTTP/1.1", b"GET /rel HTTP/1.1",
                b"GET http://user@api.test/ HTTP/1.1", b"CONNECT api.test HTTP/1.1",
                b"GET http://api.test/ HTTP/1.1\r\nBad Header: x"):
        with pytest.raises(BadRequest):
            parse_head(bad)
    with pytest.raises(ValueError):
        client_hello_sni(b"\x16\x03\x01\x00\x04\x02\x00\x00\x00")  # a ServerHello


def test_a_secret_is_masked_across_chunk_boundaries() -> None:
    secret = b"Token abc123"
    stream = b'{"X-Api-Key": "Token abc123", "again": "Token abc123"}'
    for cut in range(1, len(stream)):
        out, tail = b"", b""
        for chunk in (stream[:cut], stream[cut:]):
            now, tail = masked(secret, tail, chunk)
            out += now
        out += tail
        assert out == stream.replace(secret, b"*" * len(secret)), cut


def test_secret_values_come_only_from_the_daemons_own_sources(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EGRESS_UNIT_TOKEN", "v4lue")
    assert secret_value(SecretSpec(header="X-K", env="EGRESS_UNIT_TOKEN",
                                   prefix="Bearer ")) == "Bearer v4lue"
    with pytest.raises(SecretUnavailable, match="no environment variable EGRESS_NOPE"):
        secret_value(SecretSpec(header="X-K", env="EGRESS_NOPE"))
    path = tmp_path / "token"
    path.write_text("from-file\n")
    path.chmod(0o644)  # readable by others: refused, the value never read
    with pytest.raises(SecretUnavailable, match="mode 0600"):
        secret_value(SecretSpec(header="X-K", file=str(path)))
    path.chmod(0o600)
    assert secret_value(SecretSpec(header="X-K", file=str(path))) == "from-file"
    path.write_text("two\nlines")
    with pytest.raises(SecretUnavailable, match="spans lines"):
        secret_value(SecretSpec(header="X-K", file=str(path)))
