"""What reaches the audit log from outside, and what ``sandboxd audit tail`` prints of it.

A regression: a tool name with ``%0a`` forged a record line in ``audit tail``, and OSC/ANSI
escapes sent on an unauthenticated path reached the admin's terminal. And the 401 record's
token digest was always ``[REDACTED]`` (its key matched the secret-key pattern).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import urllib.parse
from pathlib import Path

import httpx
import pytest

from sandboxd.access.tokens import add_token
from sandboxd.audit import verify
from tests.support.audit import audit_records
from tests.support.daemon import running_daemon

#: the modern-host VM job leaves this module to make test (tests/vm/README.md)
pytestmark = pytest.mark.same_on_every_host(
    "what reaches the audit log and how `sandboxd audit tail` escapes it: the log's text and "
    "the CLI's formatting; no confinement is asserted")

# ESC ] 0 ; title BEL (OSC), CSI (7-bit and C1), a newline and a forged record after it,
# bidi override, zero-width space, NEL, a line separator
FORGED = "2026-01-01 00:00:00.000  #999  decision       client=admin  decision=allow"
HOSTILE = ("x\x1b]0;pwned\x07\x1b[2J\x9b31m\n" + FORGED + "\u202egnp.exe\u200b\x85\u2028\r")
BAD = set("\x1b\x07\x9b\u202e\u200b\x85\u2028\r")


def tail(log: Path, *args: str) -> list[str]:
    r = subprocess.run([sys.executable, "-m", "sandboxd", "audit", "tail", "-n", "1000",
                        *args, str(log)], capture_output=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "SANDBOXD_CONFIG": "/nonexistent",
                            "LANG": "C.UTF-8"})
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode("utf-8")  # strict: a lone surrogate would not even be printable
    assert not BAD & set(out), [c for c in out if c in BAD]
    return out.split("\n")[:-1]


def test_tail_escapes_what_clients_and_strangers_sent(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    good = add_token(tokens, "alice")
    bad_token = "sbx_" + "B" * 43
    quoted = "/v1/tools/" + urllib.parse.quote(HOSTILE, safe="")
    with running_daemon(tmp_path, env={"SANDBOXD_TOKENS_FILE": str(tokens)}, token=good) as d:
        # unauthenticated: the path is attacker text in the auth_failure record
        r = httpx.get(d.url + quoted, headers={"Authorization": f"Bearer {bad_token}"},
                      timeout=30)
        assert r.status_code == 401
        # authenticated: an unknown tool name, and arguments with a lone surrogate escape
        r = d.client.post(quoted + "/invoke",
                          json={"arguments": {}})
        assert r.status_code == 404, r.text
        r = d.invoke("shell", {"command": "curl " + HOSTILE})
        assert r.json()["status"] == "denied", r.text
        r = d.invoke("python", {"code": f"print({HOSTILE!r})"})
        assert r.json()["status"] == "ok", r.text
    records = audit_records(d.audit_path)
    # the attack text really is in the log, raw
    assert any(r.get("tool") == HOSTILE for r in records)
    assert any("\x1b]0;pwned" in path for r in records if r["event"] == "auth_failure"
               for path in r["paths"])
    lines = tail(d.audit_path)
    assert len(lines) == len(records), lines  # one line per record: nothing forged
    assert not any(line.startswith("2026-01-01") for line in lines)
    assert any("\\x1b]0;pwned\\x07" in line and "\\n2026-01-01" in line for line in lines)
    as_json = tail(d.audit_path, "--json")
    assert [json.loads(line) for line in as_json] == records  # same values, escaped text
    # the digest of the token that failed is kept (it is not a secret), the token not
    failure = next(r for r in records if r["event"] == "auth_failure")
    assert failure["digests"] == [hashlib.sha256(bad_token.encode()).hexdigest()[:12]], failure
    raw = d.audit_path.read_text()
    assert bad_token not in raw and good not in raw
    assert verify(d.audit_path).ok
