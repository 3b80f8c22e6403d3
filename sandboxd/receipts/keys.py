"""The receipt signing keys: one current Ed25519 key, and the public half of every key it ever
used (old receipts stay verifiable after a rotation).

In the state directory, ``receipts/`` (0700): ``signing.key`` (the current private key, PKCS#8
PEM, 0600, made at first start) and ``keys.json`` (the key set: every public key with its id,
when it was made and when it was retired). The key set is what ``GET /v1/receipts/key`` serves
and ``sandboxd receipt key`` prints: everything a verifier needs. A key id is the first 16 hex
digits of the SHA-256 of the raw 32-byte public key, so a verifier can recompute it."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from sandboxd.errors import SandboxdError
from sandboxd.util.timefmt import utc_iso

ALGORITHM = "Ed25519"
KEYSET_TYPE = "sandboxd-receipt-keys/1"


class ReceiptKeyError(SandboxdError):
    """The receipt keys cannot be read, made or rotated."""

    code = "receipt-keys"


def key_dir(state_dir: Path) -> Path:
    """Where the keys live: ``<state_dir>/receipts``."""
    return Path(state_dir) / "receipts"


def key_id(public: Ed25519PublicKey) -> str:
    """The id of a public key: SHA-256 of its raw bytes, first 16 hex digits."""
    return hashlib.sha256(_raw(public)).hexdigest()[:16]


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@dataclass(frozen=True)
class KeySet:
    """Public keys by id, and which one signs now: all a verifier needs."""

    keys: dict[str, Ed25519PublicKey]
    current: str | None
    document: dict[str, Any]

    @classmethod
    def from_document(cls, doc: Any) -> KeySet:
        """The key set of a ``keys.json`` / ``GET /v1/receipts/key`` document (ValueError when
        it is not one; a key whose id does not match its bytes is refused)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
            raise ValueError("not a receipt key set (expected an object with a 'keys' list)")
        keys: dict[str, Ed25519PublicKey] = {}
        for entry in doc["keys"]:
            try:
                public = Ed25519PublicKey.from_public_bytes(
                    base64.b64decode(entry["public_key"], validate=True))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"a key of the set is not an Ed25519 public key: {exc}") from exc
            if key_id(public) != entry.get("key_id"):
                raise ValueError(f"key {entry.get('key_id')!r}: its id is not its bytes' hash")
            keys[key_id(public)] = public
        current = doc.get("current")
        return cls(keys, current if isinstance(current, str) else None, doc)

    @classmethod
    def from_pem(cls, data: bytes) -> KeySet:
        """A key set of one public key given as PEM (``SubjectPublicKeyInfo``)."""
        public = serialization.load_pem_public_key(data)
        if not isinstance(public, Ed25519PublicKey):
            raise ValueError("the PEM key is not an Ed25519 public key")
        kid = key_id(public)
        return cls({kid: public}, kid, _document([_entry(public, None)], kid))

    def verify(self, kid: Any, signature: bytes, message: bytes) -> str | None:
        """None when ``signature`` is ``kid``'s over ``message``; else why not."""
        public = self.keys.get(kid) if isinstance(kid, str) else None
        if public is None:
            return f"unknown key id {kid!r} (not in the key set given)"
        try:
            public.verify(signature, message)
        except InvalidSignature:
            return "the signature does not match (the receipt or a field of it was changed)"
        return None


def _entry(public: Ed25519PublicKey, created: str | None) -> dict[str, Any]:
    return {"key_id": key_id(public), "algorithm": ALGORITHM,
            "public_key": base64.b64encode(_raw(public)).decode(), "created": created,
            "retired": None}


def _document(entries: list[dict[str, Any]], current: str) -> dict[str, Any]:
    return {"type": KEYSET_TYPE, "current": current, "keys": entries}


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Write ``path`` whole or not at all (a temporary file renamed over it, both synced)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class SigningKey:
    """The daemon's current key (private) and the key set (public)."""

    def __init__(self, private: Ed25519PrivateKey, keyset: KeySet) -> None:
        self.private = private
        self.key_id = key_id(private.public_key())
        self.keyset = keyset

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message)

    @classmethod
    def open(cls, state_dir: Path) -> SigningKey:
        """The state directory's key, made now when there is none (first start)."""
        directory = key_dir(state_dir)
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not (directory / "signing.key").exists():
                _new_key(directory, None)
            return cls._load(directory)
        except OSError as exc:
            raise ReceiptKeyError(f"{directory}: cannot open the receipt signing key: "
                                  f"{exc.strerror or exc}") from exc

    @classmethod
    def _load(cls, directory: Path) -> SigningKey:
        path = directory / "signing.key"
        if path.stat().st_mode & 0o077:
            raise ReceiptKeyError(f"{path}: the receipt signing key is readable by others "
                                  "(it must be 0600)")
        private = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(private, Ed25519PrivateKey):
            raise ReceiptKeyError(f"{path}: not an Ed25519 private key")
        keyset = load_keyset(directory.parent)
        if key_id(private.public_key()) not in keyset.keys:
            raise ReceiptKeyError(f"{directory / 'keys.json'}: the signing key is not in the "
                                  "key set")
        return cls(private, keyset)


def load_keyset(state_dir: Path) -> KeySet:
    """The key set of a state directory (:class:`ReceiptKeyError` when there is none)."""
    path = key_dir(state_dir) / "keys.json"
    try:
        return KeySet.from_document(json.loads(path.read_bytes()))
    except FileNotFoundError:
        raise ReceiptKeyError(f"{path}: no receipt keys yet (the daemon makes them at its "
                              "first start)") from None
    except (OSError, ValueError) as exc:
        raise ReceiptKeyError(f"{path}: {exc}") from exc


def _new_key(directory: Path, keyset: KeySet | None) -> str:
    """Make a key, add its public half to the key set (retiring the current one) and make
    it the signing key. The key set is written first: a crash in between leaves the old key
    signing, with a listed key that never signed."""
    private = Ed25519PrivateKey.generate()
    now = utc_iso()
    entries = [dict(e) for e in (keyset.document["keys"] if keyset is not None else [])]
    for entry in entries:
        entry["retired"] = entry.get("retired") or now
    entries.append(_entry(private.public_key(), now))
    kid = key_id(private.public_key())
    _write_atomic(directory / "keys.json",
                  json.dumps(_document(entries, kid), indent=2).encode() + b"\n", 0o644)
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    _write_atomic(directory / "signing.key", pem, 0o600)
    return kid


def rotate(state_dir: Path) -> str:
    """A new signing key (its id returned); the old public keys stay in the key set, the old
    private key is gone. A running daemon signs with its key until it is restarted."""
    directory = key_dir(state_dir)
    try:
        keyset = load_keyset(state_dir)
        return _new_key(directory, keyset)
    except OSError as exc:
        raise ReceiptKeyError(f"{directory}: cannot rotate the receipt key: "
                              f"{exc.strerror or exc}") from exc
