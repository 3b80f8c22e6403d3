"""How audit records become bytes: JSON of models and enums, the canonical form, its digest,
and the redaction of secrets (by key name and by pattern) with size-capped previews."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel

PREVIEW_CHARS = 1024
MESSAGE_CHARS = 2048
#: how far past a preview's cut a string is still redacted: room for a secret that starts
#: before the cut (redaction patterns scan whole strings; a multi-megabyte argument, such as a
#: file's base64 content, is cut to this before it is scanned)
SECRET_MARGIN = 4096
REDACTED = "[REDACTED]"


# ------------------------------------------------------------------ serialisation


#: how :func:`json_default` turns each kind of value into JSON, tried in order
_AS_JSON: tuple[tuple[type | tuple[type, ...], Callable[[Any], Any]], ...] = (
    (BaseModel, lambda obj: obj.model_dump(mode="json")),
    (Enum, lambda obj: obj.value),
    (Path, str),
    (datetime, lambda obj: obj.isoformat()),
    ((set, frozenset, tuple), list),
    (bytes, lambda obj: obj.decode("utf-8", "replace")),
)


def json_default(obj: Any) -> Any:
    """``json.dumps`` ``default=``: models, enums, paths, datetimes, sets and bytes as JSON."""
    for kind, convert in _AS_JSON:
        if isinstance(obj, kind):
            return convert(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


#: the canonical form's encoder, made once: ``json.dumps`` with these options builds a new one
#: on every call (a quarter of the time of a small record's receipt)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              default=json_default)


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the bytes the argument digest is computed over."""
    return _CANONICAL.encode(obj).encode("utf-8", "surrogatepass")


def digest(obj: Any) -> str:
    """SHA-256 (hex) of ``obj``'s canonical JSON."""
    return hashlib.sha256(canonical_json(obj)).hexdigest()


# ------------------------------------------------------------------ redaction

_SECRET_KEY = re.compile(
    r"^(?:.*[_.-])?(?:pass(?:word|wd|phrase)?|secrets?|tokens?|api[_-]?keys?|apikey|"
    r"authori[sz]ation|auth|credentials?|private[_-]?key|access[_-]?key|session[_-]?(?:id|key)|"
    r"cookies?|signature)(?:[_.-].*)?$", re.IGNORECASE)
# ... except a digest of a machine-made credential: not a secret, and the only way to tell
# which token a failed authentication used
_CREDENTIAL_DIGEST_KEY = re.compile(
    r"^(?:.*[_.-])?(?:tokens?|api[_-]?keys?|apikey|access[_-]?keys?|session[_-]?(?:id|key))"
    r"[_.-](?:digest|sha256|fingerprint)$", re.IGNORECASE)
_SECRET_TEXT: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----"
                r"|\Z)", re.DOTALL), "[REDACTED PRIVATE KEY]"),
    (re.compile(r"(?i)\b(bearer|basic|token)(\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1\2" + REDACTED),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), REDACTED),
    (re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"), REDACTED),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), REDACTED),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}"), REDACTED),
    (re.compile(r"\bsbx_[A-Za-z0-9_-]{16,}"), REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),
    (re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]+:)[^@\s/]+@", re.IGNORECASE),
     r"\1" + REDACTED + "@"),
    (re.compile(r"(?i)(\b[\w.-]*(?:pass(?:word|wd|phrase)?|secret|token|api[_-]?key|apikey|"
                r"access[_-]?key|private[_-]?key|auth)[\w.-]*[\"']?\s*[=:]\s*[\"']?)"
                r"([^\s\"'&,;]{3,})"), r"\1" + REDACTED),
]


#: what every match of a :data:`_SECRET_TEXT` pattern contains (case-insensitive: a superset):
#: a string without any of these is left as it is after one scan, not thirteen (every
#: string of every audit record is redacted, so this is on every call's path). The test
#: tests/audit/test_redaction_prefilter.py holds a sample of each pattern and checks that this
#: sees it.
_NEEDLES = (
    "-----begin ", "bearer", "basic", "token", "akia", "asia", "sk-",
    *(f"gh{c}_" for c in "pousr"), "github_pat_", "glpat-", *(f"xox{c}-" for c in "abprs"),
    "aiza", "sbx_", "eyj", "://", "pass", "secret", "api_key", "api-key", "apikey",
    "access_key", "access-key", "accesskey", "private_key", "private-key", "privatekey",
    "auth",
)
#: the needles, case-insensitive (none holds a regex metacharacter)
_MAY_HOLD_SECRET = re.compile("|".join(_NEEDLES), re.IGNORECASE)


#: :func:`_secret_key`'s answers for short keys: every record asks again for the same field
#: names (two regex scans a key, ~40 keys a call). Bounded in entries and in the
#: length of a key, so that keys a caller chooses (argument names) cannot make it grow.
_KEY_ANSWERS: dict[str, bool] = {}
_KEY_ANSWERS_MAX, _KEY_ANSWERS_CHARS = 4096, 64


def _secret_key(key: str) -> bool:
    """Whether values under ``key`` are redacted whole."""
    known = _KEY_ANSWERS.get(key)
    if known is not None:
        return known
    secret = _SECRET_KEY.search(key) is not None and not _CREDENTIAL_DIGEST_KEY.match(key)
    if len(key) <= _KEY_ANSWERS_CHARS and len(_KEY_ANSWERS) < _KEY_ANSWERS_MAX:
        _KEY_ANSWERS[key] = secret
    return secret


#: The fast path of :data:`_MAY_HOLD_SECRET` for ASCII text: its lower-case needles find in
#: ``text.lower()`` what the regex finds in ``text`` (ASCII letters fold only to each other) in
#: a fraction of its time: the case-insensitive regex tries every alternative at every position
#: (3-8 us for a 20-character id, and an audit record has twenty strings). Non-ASCII
#: text goes to the regex (the long s U+017F matches ``s``, the Kelvin sign ``k``, under
#: ``IGNORECASE``). tests/audit/test_redaction_prefilter.py checks that both agree. The needles
#: as one case-sensitive regex: the fastest scan of a short string.
_NEEDLE_RE = re.compile("|".join(_NEEDLES))
#: from this length on, one ``in`` per needle is the faster scan
_LONG = 256


def may_hold_secret(text: str) -> bool:
    """Whether ``text`` holds a substring that every match of a secret pattern contains:
    :data:`_MAY_HOLD_SECRET`'s answer, faster for ASCII text."""
    if not text.isascii():
        return _MAY_HOLD_SECRET.search(text) is not None
    low = text.lower()
    if len(low) < _LONG:
        return _NEEDLE_RE.search(low) is not None
    return any(needle in low for needle in _NEEDLES)


def redact_text(text: str) -> str:
    """``text`` with secret-looking substrings replaced by ``[REDACTED]``."""
    if not may_hold_secret(text):
        return text
    for pattern, replacement in _SECRET_TEXT:
        text = pattern.sub(replacement, text)
    return text


def redact(obj: Any) -> Any:
    """A copy of a JSON-like value with secrets redacted: values under secret-looking keys, and
    secret-looking substrings of every string (best effort, by pattern)."""
    if isinstance(obj, dict):
        return {str(k): (REDACTED if _secret_key(str(k)) and v not in (None, "")
                         else redact(v)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def _bounded(obj: Any, chars: int) -> Any:
    """A copy of a JSON-like value with every string cut to ``chars`` characters."""
    if isinstance(obj, dict):
        return {k: _bounded(v, chars) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_bounded(v, chars) for v in obj]
    if isinstance(obj, str):
        return obj[:chars]  # a shorter string is returned as it is
    return obj


def preview(obj: Any, limit: int = PREVIEW_CHARS) -> str:
    """Redacted JSON of ``obj``, cut to ``limit`` characters (``…`` marks a cut). Strings are
    cut to ``limit + SECRET_MARGIN`` before redaction: what is shown is redacted as if whole."""
    text = json.dumps(redact(_bounded(obj, limit + SECRET_MARGIN)), sort_keys=True,
                      ensure_ascii=False, default=json_default)
    return text if len(text) <= limit else text[:limit] + "…"


def cap(text: str | None, limit: int = MESSAGE_CHARS) -> str | None:
    """Redacted ``text`` cut to ``limit`` characters (``…`` marks a cut); None stays None."""
    if text is None:
        return None
    text = redact_text(text[:limit + SECRET_MARGIN])
    return text if len(text) <= limit else text[:limit] + "…"
