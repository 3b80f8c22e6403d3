"""TLS termination for hosts with ``secrets``: the proxy answers the sandbox's handshake with
a certificate of the daemon's own CA (:class:`DaemonCA`; its key stays in the daemon's state
directory, only the certificate goes to sandboxes), reads the request, adds the secret header,
and sends it on over a new TLS connection that verifies the real server in full.

Python's ``ssl`` (OpenSSL) does every handshake and record; this module only moves bytes
between a :class:`ssl.MemoryBIO` pair and the sandbox's stream (:class:`ServerSide`), so that
the ClientHello the proxy already read (to check its server name) is handed to OpenSSL too.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import ssl
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sandboxd.egress.rules import SecretSpec

CA_NAME = "sandboxd egress CA"
LEAF_DAYS = 7
MAX_LEAVES = 256


class SecretUnavailable(Exception):
    """The daemon cannot read a secret's value (said in the refusal; never the value)."""


def secret_value(spec: SecretSpec) -> str:
    """The header value: ``prefix`` + the daemon's env variable or file (a file must be the
    daemon's own and readable by nobody else)."""
    if spec.env is not None:
        value = _env_secret(spec.env)
    else:
        assert spec.file is not None
        value = _file_secret(spec.file)
    value = spec.prefix + value
    if not value or any(c in value for c in "\r\n\0"):
        raise SecretUnavailable("the secret's value is empty or spans lines")
    return value


def _env_secret(name: str) -> str:
    """The daemon's environment variable ``name``."""
    value = os.environ.get(name)
    if value is None:
        raise SecretUnavailable(f"the daemon has no environment variable {name}")
    return value


def _file_secret(path: str) -> str:
    """The stripped text of the file at ``path`` (its first 64 KiB), never through a
    symlink, when the file is the daemon's own and readable by nobody else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise SecretUnavailable(f"cannot open {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise SecretUnavailable(f"{path} must be the daemon's own, mode 0600")
        return os.read(fd, 64 * 1024).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass(eq=False)
class DaemonCA:
    """The daemon's CA, kept in ``directory`` (``ca.key`` 0600, ``ca.crt``), made at first
    use; leaf certificates per host, cached as server-side SSL contexts."""

    directory: Path
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    leaves: dict[str, ssl.SSLContext] = field(default_factory=dict)

    @classmethod
    def load_or_make(cls, directory: Path) -> DaemonCA:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        key_path, cert_path = directory / "ca.key", directory / "ca.crt"
        if key_path.is_file() and cert_path.is_file():
            key = serialization.load_pem_private_key(key_path.read_bytes(), None)
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            if isinstance(key, ec.EllipticCurvePrivateKey) and \
                    cert.not_valid_after_utc > datetime.datetime.now(datetime.UTC):
                return cls(directory, key, cert)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=3650))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                             False, False), critical=True)
                .sign(key, hashes.SHA256()))
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(_key_pem(key))
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cls(directory, key, cert)

    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def context_for(self, host: str) -> ssl.SSLContext:
        """A server-side context presenting a certificate for ``host`` signed by this CA."""
        ctx = self.leaves.get(host)
        if ctx is not None:
            return ctx
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
                .issuer_name(self.cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]),
                               critical=False)
                .sign(self.key, hashes.SHA256()))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        # load_cert_chain reads files only: a private temporary directory, gone at once
        with tempfile.TemporaryDirectory(prefix="sandboxd-leaf-") as tmp:
            pem = Path(tmp) / "leaf.pem"
            fd = os.open(pem, os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(_key_pem(key) + cert.public_bytes(serialization.Encoding.PEM))
            ctx.load_cert_chain(pem)
        if len(self.leaves) >= MAX_LEAVES:
            self.leaves.clear()
        self.leaves[host] = ctx
        return ctx


def upstream_context(cafile: Path | None) -> ssl.SSLContext:
    """Full verification of the real server: the system's roots, or ``cafile``'s."""
    ctx = ssl.create_default_context(cafile=str(cafile) if cafile is not None else None)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class ServerSide:
    """The TLS server end of a sandbox's tunnel over a MemoryBIO pair."""

    def __init__(self, ctx: ssl.SSLContext, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, hello: bytes) -> None:
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self.reader, self.writer = reader, writer
        self.incoming.write(hello)
        self.raw_in = len(hello)

    async def _flush(self) -> None:
        data = self.outgoing.read()
        if data:
            self.writer.write(data)
            await self.writer.drain()

    async def _fill(self) -> bool:
        data = await self.reader.read(64 * 1024)
        if not data:
            self.incoming.write_eof()
            return False
        self.raw_in += len(data)
        self.incoming.write(data)
        return True

    async def handshake(self) -> None:
        while True:
            try:
                self.obj.do_handshake()
                await self._flush()
                return
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    raise ConnectionError("the sandbox closed during the handshake") from None

    async def read(self) -> bytes:
        """Plaintext from the sandbox; b"" at its end."""
        while True:
            try:
                return self.obj.read(64 * 1024)
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    return b""
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""

    async def write(self, data: bytes) -> None:
        self.obj.write(data)
        await self._flush()

    async def close(self) -> None:
        with contextlib.suppress(ssl.SSLError, ssl.SSLWantReadError):
            self.obj.unwrap()
        await self._flush()


def masked(secret: bytes, tail: bytes, chunk: bytes) -> tuple[bytes, bytes]:
    """``chunk`` with every occurrence of ``secret`` (also across the chunk before, whose
    last ``len(secret) - 1`` bytes are ``tail``) replaced by asterisks; returns (bytes to
    send now, the new tail held back)."""
    data = (tail + chunk).replace(secret, b"*" * len(secret))
    keep = len(secret) - 1
    if keep == 0:
        return data, b""
    if len(data) <= keep:
        return b"", data
    return data[:-keep], data[-keep:]
