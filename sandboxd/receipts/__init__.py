"""Signed receipts: every result carries an Ed25519 signature over a canonical record of its
call that anyone holding the public key can check offline, and the audit log's head is signed
so that cutting records from its end is found.

Modules: ``keys`` (the key and the key set, rotation), ``canonical`` (the signed record, the
checks), ``sign`` (the daemon's signer), ``heads`` (the audit log's signed heads). The daemon
imports ``sign``; ``sandboxd receipt verify`` needs only ``keys`` and ``canonical``."""
