"""The modules the restricted backend's python offers, by name only: what the daemon's policy
checks read (:attr:`ENTRY.imports`). The module table itself (:mod:`.lang.module_allowlist`)
lives in the worker's stack (RestrictedPython, the proxies, the modules themselves): the daemon
does not import it (every module it imports is memory it keeps for good), and the table checks
at import that it offers exactly these."""

from __future__ import annotations

OFFERED_MODULES: frozenset[str] = frozenset({
    "array", "base64", "binascii", "bisect", "calendar", "cmath", "collections", "copy", "csv",
    "datetime", "decimal", "difflib", "enum", "fractions", "functools", "hashlib", "heapq",
    "hmac", "itertools", "json", "math", "numbers", "operator", "pprint", "random", "re",
    "statistics", "string", "struct", "textwrap", "time", "unicodedata", "uuid",
})
