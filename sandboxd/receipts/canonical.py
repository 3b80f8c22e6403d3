"""The canonical record a receipt signs, and the checks of a receipt and of a result against it.

A receipt is a flat JSON object: the record's fields, ``key_id`` and ``signature``. The signed
bytes are the canonical JSON (:func:`sandboxd.audit.canonical_json`: sorted keys, no
whitespace, UTF-8) of the receipt without ``signature``; ``type`` separates it from the other
things the key signs (the audit log's heads). The fields (docs/receipts.md has the table):
``id``, ``client``, ``tool``, ``session``, ``transport``, ``args_sha256``, ``policy`` (source,
rule, decision, sha256 of the policy file), ``backend``, ``node``, ``limits``, ``status``,
``stdout_sha256``, ``stderr_sha256``, ``value_sha256``, ``outputs_sha256`` (one per display
item), ``result_sha256`` (every other field of the result), ``started``, ``ended`` and
``audit`` (the seq and SHA-256 of the call's ``result`` record: the chain head that includes
it)."""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from sandboxd.audit.encoding import canonical_json
from sandboxd.receipts.keys import KeySet

RECEIPT_TYPE = "sandboxd-receipt/1"
#: the result's fields with a hash of their own; ``result_sha256`` covers every other field
OWN_HASH = ("stdout", "stderr", "value", "outputs")
#: what ``result_sha256`` leaves out besides :data:`OWN_HASH`: the receipt itself
NOT_HASHED = frozenset({"receipt", *OWN_HASH})


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


#: the hashes of what most results hold (no value, no stderr): computed once
_NULL, _EMPTY = _sha(b"null"), _sha(b"")


def _text(text: Any) -> str:
    """SHA-256 of a text field's UTF-8 bytes (stdout, stderr)."""
    return _sha(str(text).encode("utf-8", "surrogatepass")) if text != "" else _EMPTY


def result_hashes(wire: dict[str, Any]) -> dict[str, Any]:
    """The hashes a receipt holds of a result as a client gets it (its JSON as data)."""
    rest = {k: v for k, v in wire.items() if k not in NOT_HASHED}
    value = wire.get("value")
    return {
        "stdout_sha256": _text(wire.get("stdout", "")),
        "stderr_sha256": _text(wire.get("stderr", "")),
        "value_sha256": _sha(canonical_json(value)) if value is not None else _NULL,
        "outputs_sha256": [_sha(canonical_json(item)) for item in wire.get("outputs") or []],
        "result_sha256": _sha(canonical_json(rest)),
    }


def signed_bytes(receipt: dict[str, Any]) -> bytes:
    """What the signature covers: the receipt's canonical JSON without ``signature``."""
    return canonical_json({k: v for k, v in receipt.items() if k != "signature"})


def check_receipt(receipt: Any, keys: KeySet, *, kind: str = RECEIPT_TYPE) -> str | None:
    """None when ``receipt`` is signed by a key of ``keys``; else why not (one line)."""
    if not isinstance(receipt, dict):
        return "not a receipt (expected a JSON object)"
    if receipt.get("type") != kind:
        return f"not a {kind} (type {receipt.get('type')!r})"
    try:
        signature = base64.b64decode(receipt.get("signature") or "", validate=True)
    except (binascii.Error, ValueError, TypeError):
        return "the signature is not base64"
    try:
        message = signed_bytes(receipt)
    except (TypeError, ValueError) as exc:
        return f"the receipt is not JSON data: {exc}"
    return keys.verify(receipt.get("key_id"), signature, message)


def check_result(result: dict[str, Any], receipt: dict[str, Any]) -> list[str]:
    """The fields of ``result`` (a result as the daemon returned it) that do not match its
    receipt; empty when every output and field does."""
    problems = [_hash_problem(name) for name, digest in result_hashes(result).items()
                if receipt.get(name) != digest]
    return problems + [f"{name}: {result.get(name)!r} in the result, "
                       f"{receipt.get(name)!r} in the receipt"
                       for name in ("id", "tool", "session", "node", "backend", "status")
                       if result.get(name) != receipt.get(name)]


def _hash_problem(name: str) -> str:
    """What a receipt's hash ``name`` that the result does not match says."""
    field = name.removesuffix("_sha256")
    what = ("the result's other fields (id, status, message, resources, ...)"
            if field == "result" else field)
    return f"{what}: the hash does not match the receipt's {name}"
