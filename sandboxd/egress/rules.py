"""The ``egress:`` policy block and its rules: which hosts, ports, methods and paths a sandbox
may reach through the daemon's egress proxy (default deny).

::

    egress:
      allow:
        - "api.example.com:443 GET,POST /v1/"   # exact host, port, methods, path prefix
        - "*.pypi.org:443"                      # any name below pypi.org (not pypi.org itself)
        - "10.1.2.0/24:8080"                    # addresses, only when written as such
      secrets:
        api.example.com: {header: Authorization, env: API_TOKEN, prefix: "Bearer "}

An entry is one string, so that an error points at the exact entry (``file:line:col``). A
host entry never matches an IP literal and an address entry never matches a name; a name
that resolves to a private, loopback or link-local address is refused unless an address
entry covers that address (the rebinding rule, :func:`EgressRules.address_allowed`).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
HOSTNAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_ENTRY = re.compile(r"^(?P<target>\[[0-9a-fA-F:./]+\]|[^\s:]+):(?P<port>[0-9]{1,5})"
                    r"(?:\s+(?P<methods>[A-Z]+(?:,[A-Z]+)*))?(?:\s+(?P<path>/\S*))?$")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_HEADER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


@dataclass(frozen=True)
class Rule:
    """One ``allow`` entry, parsed: ``text`` is the entry as written (named in denials)."""

    text: str
    port: int
    host: str | None = None  # an exact name, or ".suffix" for "*.suffix"
    network: IPNetwork | None = None
    methods: frozenset[str] = frozenset()  # empty: any
    path: str | None = None  # a path prefix; None: any

    @property
    def l7(self) -> bool:
        """Whether the rule restricts methods or paths (checkable only on HTTP it can read)."""
        return bool(self.methods) or self.path is not None

    def matches_name(self, host: str, port: int) -> bool:
        if self.host is None or port != self.port:
            return False
        if self.host.startswith("."):
            return host.endswith(self.host) and len(host) > len(self.host)
        return host == self.host

    def matches_address(self, addr: IPAddress, port: int) -> bool:
        return self.network is not None and port == self.port and addr in self.network

    def matches_request(self, method: str, path: str) -> bool:
        return ((not self.methods or method in self.methods)
                and (self.path is None or path.startswith(self.path)))


def parse_entry(text: str) -> Rule:
    """One ``allow`` entry; ``ValueError`` says what is wrong with it."""
    match = _ENTRY.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not an egress entry: write HOST:PORT [METHODS] [/PATH] "
                         "(e.g. 'api.example.com:443 GET,POST /v1/') or CIDR:PORT")
    port = int(match["port"])
    if not 1 <= port <= 65535:
        raise ValueError(f"{text!r}: port {port} is not between 1 and 65535")
    methods = _methods(text, match["methods"])
    target = match["target"].strip("[]")
    fields = {"text": text, "port": port, "methods": methods, "path": match["path"]}
    network = _network(target)
    if network is not None:
        return Rule(network=network, **fields)  # type: ignore[arg-type]
    return Rule(host=_host(text, target), **fields)  # type: ignore[arg-type]


def _methods(text: str, listed: str | None) -> frozenset[str]:
    """The methods an entry lists (none: any method), each a known one."""
    methods = frozenset(listed.split(",")) if listed else frozenset()
    unknown = sorted(methods - METHODS)
    if unknown:
        raise ValueError(f"{text!r}: unknown method(s) {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(METHODS))})")
    return methods


def _host(text: str, target: str) -> str:
    """The host a name entry allows, lower case: ``.suffix`` for ``*.suffix`` (a suffix of
    at least two labels), else the exact name."""
    name = target.lower()
    wildcard = name.startswith("*.")
    bare = name[2:] if wildcard else name
    if not HOSTNAME.match(bare) or ("." not in bare and wildcard):
        raise ValueError(f"{text!r}: {target!r} is neither a host name, '*.suffix' nor an "
                         "IP address or CIDR")
    return "." + bare if wildcard else bare


def _network(target: str) -> IPNetwork | None:
    if not re.fullmatch(r"[0-9a-fA-F:./]+", target) or not re.search(r"[:/]|^[0-9.]+$", target):
        return None
    try:
        return ipaddress.ip_network(target, strict=True)
    except ValueError as exc:
        raise ValueError(f"{target!r} is not an IP address or CIDR: {exc}") from None


def _entry(value: str) -> str:
    parse_entry(value)
    return value


def _secret_host(value: str) -> str:
    if not HOSTNAME.match(value):
        raise ValueError(f"{value!r}: secrets are per exact host name (no '*.', no address)")
    return value


class SecretSpec(BaseModel):
    """``egress.secrets.<host>``: a header the proxy adds to every request to ``host`` (TLS is
    terminated for it), its value read by the daemon from ``env`` or ``file`` (one of them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    header: Annotated[str, Field(pattern=_HEADER.pattern)]
    env: Annotated[str, Field(pattern=_ENV.pattern)] | None = None
    file: str | None = None
    prefix: str = ""

    @model_validator(mode="after")
    def _one_source(self) -> SecretSpec:
        if (self.env is None) == (self.file is None):
            raise ValueError("name exactly one source of the value: env or file")
        if self.file is not None and not self.file.startswith("/"):
            raise ValueError(f"file {self.file!r} must be an absolute path")
        return self


EgressEntry = Annotated[str, AfterValidator(_entry)]
SecretHost = Annotated[str, AfterValidator(_secret_host)]


class EgressSpec(BaseModel):
    """``egress:`` of a policy or a tool (a tool's replaces the policy's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow: list[EgressEntry] = Field(default_factory=list)
    secrets: dict[SecretHost, SecretSpec] = Field(default_factory=dict)

    def compiled(self, policy: str) -> EgressRules:
        return EgressRules(policy=policy, rules=tuple(parse_entry(e) for e in self.allow),
                           secrets=tuple(sorted(self.secrets.items())))


@dataclass(frozen=True)
class EgressRules:
    """What one sandbox may reach: the compiled ``allow`` entries of ``policy``."""

    policy: str
    rules: tuple[Rule, ...]
    secrets: tuple[tuple[str, SecretSpec], ...] = ()

    def for_name(self, host: str, port: int) -> list[Rule]:
        return [r for r in self.rules if r.matches_name(host, port)]

    def for_address(self, addr: IPAddress, port: int) -> Rule | None:
        return next((r for r in self.rules if r.matches_address(addr, port)), None)

    def address_allowed(self, addr: IPAddress, port: int) -> Rule | bool | None:
        """Whether a name's answer ``addr`` may be connected to: True for a public address;
        the address rule that names a private/loopback/link-local one; None: refused."""
        if is_public(addr):
            return True
        return self.for_address(addr, port)

    def secret_for(self, host: str) -> SecretSpec | None:
        return dict(self.secrets).get(host)

    def describe(self) -> list[str]:
        """One line per rule, for ``policy explain``."""
        lines = [r.text for r in self.rules] or ["(nothing: every connection is refused)"]
        return lines + [f"{h}: header {s.header} from "
                        f"{'env ' + s.env if s.env else 'file ' + str(s.file)}"
                        for h, s in self.secrets]


def is_public(addr: IPAddress) -> bool:
    """Not private, loopback, link-local, multicast, reserved or unspecified (an IPv4-mapped
    IPv6 address is judged as its IPv4 address)."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_global and not addr.is_multicast


def ip_literal(host: str) -> IPAddress | None:
    """``host`` as an address when it is one (``[v6]`` too), else None."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
