"""Arguments are stored as a digest plus a capped, redacted preview; secrets never land."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from sandboxd.audit import AuditLog, canonical_json, preview, redact, verify
from sandboxd.models import (
    Decision,
    Limits,
    Reason,
    Result,
    Status,
    Termination,
)
from sandboxd.protocol.plan import ExecutionPlan, Plan, ToolKind

SECRETS = [
    "sk-abcdefghijklmnopqrstuvwx",
    "ghp_abcdefghijklmnopqrstuvwxyz0123",
    "AKIAIOSFODNN7EXAMPLE",
    "hunter2hunter2",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abcdefghijklmnop",
    "sbx_0123456789abcdefghijklmnop",
    "s3cr3tP4ss",
]


def test_redaction_by_key_and_by_pattern() -> None:
    args = {
        "command": "curl -H 'Authorization: Bearer sk-abcdefghijklmnopqrstuvwx' "
                   "https://bob:hunter2hunter2@example.com/?api_key=AKIAIOSFODNN7EXAMPLE",
        "password": "s3cr3tP4ss",
        "nested": [{"github_token": "ghp_abcdefghijklmnopqrstuvwxyz0123"},
                   "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abcdefghijklmnop"],
        "code": "TOKEN = 'sbx_0123456789abcdefghijklmnop'\nprint('hello')",
        "author": "kept",
    }
    text = json.dumps(redact(args))
    for secret in SECRETS:
        assert secret not in text
    assert "[REDACTED]" in text and "print('hello')" in text and '"author": "kept"' in text
    key = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\n"
           "-----END OPENSSH PRIVATE KEY-----")
    assert redact({"content": f"x\n{key}\ny"}) == {"content": "x\n[REDACTED PRIVATE KEY]\ny"}


def test_preview_is_capped() -> None:
    text = preview({"code": "x" * 10_000})
    assert len(text) <= 1025 and text.endswith("…")


def test_decision_record_has_digest_preview_rule_and_limits(tmp_path: Path) -> None:
    log_path = tmp_path / "audit.jsonl"
    args = {"command": "echo password=s3cr3tP4ss", "x": "y" * 5000}
    decision = Decision(allowed=False, source="policies/default.yaml",
                        rule="tools.shell.commands.deny[2]", message="`curl` is not allowed",
                        policy_name="default", backend="container")
    allowed = Decision(allowed=True, source="policies/default.yaml", rule="tools.python",
                       policy_name="default", backend="restricted",
                       plan=ExecutionPlan(kind=ToolKind.command, limits=Limits(timeout_s=5),
                                          command=Plan.single(["tool", "--password=s3cr3tP4ss"])))
    with AuditLog(log_path) as log:
        log.decision(request_id="req_1", client="alice", tool="shell", session=None,
                     arguments=args, decision=decision)
        log.decision(request_id="req_2", client="alice", tool="python", session="ses_1",
                     arguments={"code": "1"}, decision=allowed)
        log.result(request_id="req_2", client="alice", result=Result(
            id="inv_1", tool="python", status=Status.ok, backend="restricted",
            termination=Termination(reason=Reason.exited, exit_code=0), stdout="2\n",
            limits=Limits(timeout_s=5), message="token sk-abcdefghijklmnopqrstuvwx"))
    raw = log_path.read_text()
    assert "s3cr3tP4ss" not in raw and "sk-abcdefghijklmnopqrstuvwx" not in raw
    deny, allow, result = (json.loads(line) for line in raw.splitlines())
    assert deny["args_sha256"] == hashlib.sha256(canonical_json(args)).hexdigest()
    assert deny["args_bytes"] == len(canonical_json(args))
    assert len(deny["args_preview"]) <= 1025
    assert (deny["decision"], deny["rule"], deny["source"]) == (
        "deny", "tools.shell.commands.deny[2]", "policies/default.yaml")
    assert deny["message"] == "`curl` is not allowed" and deny["limits"] is None
    assert allow["decision"] == "allow" and allow["limits"]["timeout_s"] == 5
    assert allow["session"] == "ses_1" and allow["request_id"] == "req_2"
    assert allow["argv_preview"] == '["tool", "--password=[REDACTED]"]'
    assert "argv_preview" not in deny
    assert result["status"] == "ok" and result["termination"]["reason"] == "exited"
    assert result["resources"] == {"wall_ms": 0, "cpu_ms": 0, "peak_memory_bytes": 0}
    assert result["stdout_bytes"] == 2 and result["invocation"] == "inv_1"
    assert verify(log_path).ok


def test_digests_of_machine_credentials_are_kept_secrets_are_not() -> None:
    kept = {"token_digest": "0123456789ab", "api_key_sha256": "cafe", "session_id_digest": "d"}
    assert redact(kept) == kept
    for key in ("token", "token_digest_x", "password_digest", "secret_sha256", "passphrase_hash",
                "github_token", "private_key_fingerprint"):
        assert redact({key: "value"}) == {key: "[REDACTED]"}, key


def test_preview_of_a_huge_argument_is_redacted_like_a_whole_one() -> None:
    """A file's base64 content is megabytes: its preview is cut before it is scanned
    (bench/bench_files.py measures the difference) and still never shows a secret."""
    import base64
    import random

    blob = base64.b64encode(random.Random(1).randbytes(3 * 1024 * 1024)).decode()
    for at in (0, 500, 1000):  # a secret before, in and across the preview's cut
        content = blob[:at] + " api_key=" + SECRETS[0] + " " + blob[at:]
        shown = preview({"path": "a.bin", "content": content})
        assert SECRETS[0] not in shown and not any(
            SECRETS[0][:n] in shown for n in range(8, len(SECRETS[0]))), (at, shown[-80:])
        assert shown.endswith("…") and len(shown) <= 1024 + 1
        # the same as redacting the whole value and cutting after (on a prefix small enough)
        whole = json.dumps(redact({"path": "a.bin", "content": content[:20_000]}),
                           sort_keys=True, ensure_ascii=False)
        assert shown == whole[:1024] + "…"
