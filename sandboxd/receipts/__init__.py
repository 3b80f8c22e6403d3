"""Signed receipts: every result carries an Ed25519 signature over a canonical record of its
call that anyone holding the public key can check offline, and the audit log's head is signed
so that cutting records from its end is found.

Modules: ``keys`` (the key and the key set, rotation), ``canonical`` (the signed record, the
checks), ``sign`` (the daemon's signer), ``heads`` (the audit log's signed heads),
``recorder`` (a call's audit record and its signed receipt, written together, so no result is
lost and none is unaudited). The daemon imports ``sign`` and ``recorder``; ``sandboxd receipt
verify`` needs only ``keys`` and ``canonical``."""
