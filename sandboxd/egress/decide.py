"""The egress decision for one request: which rule allows it, or why it is refused. One
definition, used for CONNECT and plain HTTP alike (and again for every redirect hop, which
is a new request)."""

from __future__ import annotations

from dataclasses import dataclass

from sandboxd.egress.rules import HOSTNAME, EgressRules, IPAddress, Rule, ip_literal

DEFAULT_DENY = "egress.allow (default deny)"


@dataclass(frozen=True)
class Verdict:
    """``rule``: the entry that allows it, or the rule that refuses it; ``reason``: why
    (denials); ``tls_blind``: allowed for a tunnel only by rules that do not restrict
    methods or paths."""

    allowed: bool
    rule: str
    reason: str = ""


def _deny(rule: str, reason: str) -> Verdict:
    return Verdict(False, rule, reason)


def check_target(rules: EgressRules, host: str, port: int, method: str,
                 path: str | None) -> Verdict:
    """Whether ``host:port`` may be reached; ``path`` None: a CONNECT tunnel whose requests
    the proxy cannot read (method/path rules then cannot allow it), unless the proxy
    terminates it (a host with secrets: each request is checked again inside)."""
    where = f"policy '{rules.policy}'"
    addr = ip_literal(host)
    if addr is not None:
        rule = rules.for_address(addr, port)
        if rule is None:
            return _deny(DEFAULT_DENY, f"{host}:{port} is an IP address, which no address "
                         f"entry of {where} allows (names only)")
        return _l7([rule], host, port, method, path, where)
    if not HOSTNAME.match(host):
        return _deny(DEFAULT_DENY, "malformed host name")
    matching = rules.for_name(host, port)
    if not matching:
        return _deny(DEFAULT_DENY, f"no egress.allow entry of {where} matches {host}:{port}")
    return _l7(matching, host, port, method, path, where,
               terminated=rules.secret_for(host) is not None)


def _l7(matching: list[Rule], host: str, port: int, method: str, path: str | None,
        where: str, terminated: bool = False) -> Verdict:
    if path is None:
        return _tunnel(matching, host, port, where, terminated)
    for rule in matching:
        if rule.matches_request(method, path):
            return Verdict(True, f"egress.allow: {rule.text}")
    return _deny(f"egress.allow: {matching[0].text}",
                 f"{method} {path} on {host}:{port} is outside what {where} allows")


def _tunnel(matching: list[Rule], host: str, port: int, where: str,
            terminated: bool) -> Verdict:
    """The verdict on a CONNECT tunnel, whose requests the proxy cannot read: allowed by an
    entry with no method or path, or for a host with secrets (each request in the tunnel is
    then checked); refused by entries with methods or paths only."""
    plain = [r for r in matching if not r.l7]
    if plain:
        return Verdict(True, f"egress.allow: {plain[0].text}")
    if terminated:
        return Verdict(True, f"egress.allow: {matching[0].text}")
    return _deny(f"egress.allow: {matching[0].text}",
                 f"{host}:{port} is allowed by {where} for some methods or paths only, "
                 "which the proxy cannot see inside a TLS tunnel")


def check_address(rules: EgressRules, host: str, port: int,
                  answers: list[IPAddress]) -> tuple[IPAddress | None, Verdict | None]:
    """The first answer for an allowed name that may be connected to; else the refusal
    (a private, loopback or link-local answer that no address entry names: rebinding)."""
    for addr in answers:
        ok = rules.address_allowed(addr, port)
        if ok:
            return addr, None
    shown = ", ".join(str(a) for a in answers[:4])
    return None, _deny("egress (private answers)",
                       f"{host} resolved to {shown}: private, loopback or link-local "
                       f"addresses need an address entry of policy '{rules.policy}'")


def same_host(connect_host: str, other: str | None) -> bool:
    """Whether a Host header or TLS server name names the CONNECT (or URL) host."""
    if other is None:
        return False
    name = other.lower().rstrip(".")
    if name.startswith("["):
        name = name.partition("]")[0].strip("[")
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    return name == connect_host
