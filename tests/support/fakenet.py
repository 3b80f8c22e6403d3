"""A fake internet on this machine only, for the egress tests: a DNS server, HTTP and HTTPS
servers (with their own CA) on loopback addresses of ``127.1.0.0/16`` (Linux routes the whole
of ``127/8`` to ``lo``; nothing here can reach or be reached from another machine).

``allowed`` servers live in ``127.1.2.0/24`` (which the tests' policies name with an address
entry, as an admin names a private service), the ``forbidden`` one in ``127.1.3.0/24``.
Every DNS question is recorded (:attr:`FakeNet.questions`), so that a test can show a name
never left the proxy.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from dnslib import QTYPE, RR, A  # type: ignore[import-untyped]
from dnslib.server import BaseResolver, DNSLogger, DNSServer  # type: ignore[import-untyped]

from tests.support.daemon import free_port

ALLOWED_IP = "127.1.2.10"
FORBIDDEN_IP = "127.1.3.10"
DNS_IP = "127.1.2.53"
ALLOWED_NET = "127.1.2.0/24"


class _Handler(BaseHTTPRequestHandler):
    server_version = "fakenet"
    protocol_version = "HTTP/1.1"  # keeps a connection for the next request (the benchmark)
    disable_nagle_algorithm = True  # head and body are two writes: no 40 ms delayed-ACK wait

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        name = getattr(self.server, "label", "?")
        self.server.requests.append(  # type: ignore[attr-defined]
            {"path": self.path, "headers": dict(self.headers.items())})
        served = self.server.files.get(self.path)  # type: ignore[attr-defined]
        if served is not None:  # a file a test put on the fake internet (a package index)
            self.send_response(200)
            self.send_header("Content-Type", served[0])
            self.send_header("Content-Length", str(len(served[1])))
            self.end_headers()
            self.wfile.write(served[1])
            return
        if self.path.startswith("/redirect/"):
            self.send_response(302)
            self.send_header("Location", self.path.removeprefix("/redirect/"))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.partition("?")[0] == "/headers":  # "?who" tells callers apart
            body = json.dumps(dict(self.headers.items())).encode()
        else:
            body = f"hello from {name} {self.path}\n".encode()
        if self.path.endswith("/keepreading"):  # a server that reads on despite
            self.close_connection = False       # "Connection: close" (request smuggling)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


@dataclass
class CA:
    """A certificate authority of the test's own, and leaf certificates it signs."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def make(cls, name: str = "fakenet test CA") -> CA:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def write(self, where: Path) -> Path:
        path = where / "fakenet-ca.pem"
        path.write_bytes(self.pem())
        return path

    def leaf(self, names: list[str], where: Path) -> tuple[Path, Path]:
        """A server certificate for ``names``: (cert file, key file) under ``where``."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
                .issuer_name(self.cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]),
                               critical=False)
                .sign(self.key, hashes.SHA256()))
        cert_path, key_path = where / f"{names[0]}.crt", where / f"{names[0]}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert_path, key_path


class _Zone(BaseResolver):  # type: ignore[misc]
    def __init__(self, net: FakeNet) -> None:
        self.net = net

    def resolve(self, request: Any, handler: Any) -> Any:
        reply = request.reply()
        qname = str(request.q.qname).rstrip(".").lower()
        self.net.questions.append((qname, QTYPE[request.q.qtype]))
        ip = self.net.zone.get(qname)
        if ip is not None and request.q.qtype == QTYPE.A:
            reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(ip), ttl=1))
        return reply


@dataclass
class FakeNet:
    """The running fake internet: ``zone`` (name -> IPv4), the servers' ports."""

    where: Path
    zone: dict[str, str] = field(default_factory=dict)
    questions: list[tuple[str, str]] = field(default_factory=list)
    ca: CA = field(default_factory=CA.make)
    http_port: int = 0
    https_port: int = 0
    dns_port: int = 0
    servers: list[ThreadingHTTPServer] = field(default_factory=list)
    #: what every server answers for a path besides its greeting: path -> (type, body)
    files: dict[str, tuple[str, bytes]] = field(default_factory=dict)

    @property
    def resolver(self) -> str:
        return f"{DNS_IP}:{self.dns_port}"

    def requests(self, label: str) -> list[dict[str, Any]]:
        return next(s.requests for s in self.servers  # type: ignore[attr-defined]
                    if s.label == label)  # type: ignore[attr-defined]

    def _serve(self, label: str, ip: str, port: int,
               tls_names: list[str] | None = None) -> None:
        server = ThreadingHTTPServer((ip, port), _Handler)
        server.label = label  # type: ignore[attr-defined]
        server.requests = []  # type: ignore[attr-defined]
        server.files = self.files  # type: ignore[attr-defined]
        server.daemon_threads = True
        if tls_names:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(*self.ca.leaf(tls_names, self.where))
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.servers.append(server)

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


@contextlib.contextmanager
def fake_internet(where: Path) -> Iterator[FakeNet]:
    """Start the fake internet: ``api.test`` (HTTP and HTTPS), ``other.test``, ``secret.test``
    and ``index.test`` (HTTPS, same allowed address), ``forbidden.test`` and
    ``forbidden-index.test`` (HTTP and HTTPS on their own address), and names that rebind to
    loopback, the Docker bridge and the metadata address."""
    net = FakeNet(where)
    net.http_port, net.https_port = free_port(), free_port()
    net.zone.update({"api.test": ALLOWED_IP, "other.test": ALLOWED_IP, "secret.test": ALLOWED_IP,
                     "index.test": ALLOWED_IP, "forbidden-index.test": FORBIDDEN_IP,
                     "forbidden.test": FORBIDDEN_IP, "rebind-loopback.test": "127.0.0.1",
                     "rebind-bridge.test": "172.17.0.1",
                     "rebind-metadata.test": "169.254.169.254"})
    net._serve("api", ALLOWED_IP, net.http_port)
    net._serve("api-tls", ALLOWED_IP, net.https_port,
               ["api.test", "other.test", "secret.test", "index.test"])
    net._serve("forbidden", FORBIDDEN_IP, net.http_port)
    net._serve("forbidden-tls", FORBIDDEN_IP, net.https_port,
               ["forbidden.test", "forbidden-index.test"])
    dns = None
    for _ in range(5):  # a UDP port that was free a moment ago may be taken meanwhile
        net.dns_port = free_port()
        with contextlib.suppress(OSError):
            dns = DNSServer(_Zone(net), address=DNS_IP, port=net.dns_port,
                            logger=DNSLogger(logf=lambda _line: None))
            dns.start_thread()
            break
    assert dns is not None, "no UDP port for the fake DNS server"
    try:
        yield net
    finally:
        dns.stop()
        net.close()
