"""Signed receipts through the real daemon: a result checked offline with nothing but the
public key set; a changed byte anywhere fails; the receipt names the audit record of its call;
records cut after a signed head are reported by ``audit verify``; a rotated key keeps the old
receipts valid. Streamed and MCP results carry the receipt too."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse

from sandboxd.access.tokens import add_token
from sandboxd.policy.store import embedded_policies_dir
from sandboxd.receipts.canonical import check_receipt, check_result
from sandboxd.receipts.keys import KeySet, SigningKey
from tests.support import cli
from tests.support.audit import audit_records
from tests.support.daemon import RunningDaemon, running_daemon
from tests.support.mcp_raw import RawMcp
from tests.support.wait import wait_until

#: a verifier's environment: no daemon settings, no state directory
OFFLINE = {"PATH": "/usr/bin:/bin", "SANDBOXD_CONFIG": os.devnull}
CODE = "print('out')\ndisplay([1])\n(6 * 7)"


def sandboxd(*args: str, env: dict[str, str] | None = None) -> Any:
    return cli.run(*args, env=env or OFFLINE)


def keyset(d: RunningDaemon) -> dict[str, Any]:
    r = d.client.get("/v1/receipts/key")
    assert r.status_code == 200, r.text
    return r.json()


def verify_file(tmp_path: Path, data: Any, keys: dict[str, Any] | str, name: str = "r") -> Any:
    """``sandboxd receipt verify --key KEYS FILE`` offline (files written here)."""
    result_file, key_file = tmp_path / f"{name}.json", tmp_path / f"{name}-keys"
    result_file.write_text(json.dumps(data))
    key_file.write_text(keys if isinstance(keys, str) else json.dumps(keys))
    return sandboxd("receipt", "verify", "--key", str(key_file), str(result_file))


def leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every scalar inside ``value``."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from leaves(v, (*path, i))
    else:
        yield path


def changed(value: Any) -> Any:
    """``value`` with one byte changed (a string's last character, a number plus one...)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str) and value:
        return value[:-1] + ("A" if value[-1] != "A" else "B")
    return "x"


def with_change(data: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    target = out
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = changed(target[path[-1]])
    return out


def test_a_result_verifies_offline_with_only_the_public_key(daemon: RunningDaemon,
                                                            tmp_path: Path) -> None:
    r = daemon.invoke("python", {"code": CODE})
    assert r.status_code == 200, r.text
    result = r.json()
    assert result["status"] == "ok" and result["outputs"] and result["value"] == 42
    receipt = result["receipt"]
    keys = keyset(daemon)
    assert receipt["key_id"] == keys["current"]
    assert (receipt["id"], receipt["client"], receipt["tool"], receipt["status"]) == (
        result["id"], "local", "python", "ok")
    assert len(receipt["outputs_sha256"]) == 1
    printed = sandboxd("receipt", "key", "--state-dir", str(daemon.state_dir))
    assert printed.returncode == 0 and json.loads(printed.stdout) == keys
    pem = sandboxd("receipt", "key", "--pem", "--state-dir", str(daemon.state_dir)).stdout
    assert pem.startswith("-----BEGIN PUBLIC KEY-----")
    daemon.stop()  # offline: no daemon, no state directory, the key set alone
    ok = verify_file(tmp_path, result, keys)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith(f"ok: the receipt and the result's outputs of {result['id']}")
    alone = verify_file(tmp_path, receipt, pem, "alone")  # the receipt alone, a PEM key
    assert alone.returncode == 0 and alone.stdout.startswith("ok: the receipt of")
    other = {"keys": [], "current": None}
    unknown = verify_file(tmp_path, result, other, "other")
    assert unknown.returncode == 1 and "unknown key id" in unknown.stdout


def test_a_changed_byte_in_any_field_or_output_fails(daemon: RunningDaemon,
                                                     tmp_path: Path) -> None:
    result = daemon.invoke("python", {"code": CODE}).json()
    keys = KeySet.from_document(keyset(daemon))
    receipt = result["receipt"]
    assert check_receipt(receipt, keys) is None and check_result(result, receipt) == []
    for path in leaves(receipt):  # every field of the receipt, its signature included
        assert check_receipt(with_change(receipt, path), keys) is not None, path
    body = {k: v for k, v in result.items() if k != "receipt"}
    for path in leaves(body):  # every field and output of the result
        if path in (("value_repr",), ("message",), ("session",)) or path[:1] == ("kernel",):
            continue  # null here: changed below as a whole
        assert check_result(with_change(result, path), receipt), path
    for name in ("value_repr", "message", "kernel", "session"):
        assert check_result({**result, name: "x"}, receipt), name
    # the same through the command: a changed byte of stdout, and of the receipt
    keys_doc = keyset(daemon)
    out = verify_file(tmp_path, {**result, "stdout": "ouT\n"}, keys_doc, "stdout")
    assert out.returncode == 1
    assert "stdout: the hash does not match the receipt's stdout_sha256" in out.stdout
    forged = verify_file(tmp_path, with_change(result, ("receipt", "status")), keys_doc, "st")
    assert forged.returncode == 1 and "the signature does not match" in forged.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  nope")
    r = sandboxd("receipt", "verify", "--key", str(tmp_path / "st-keys"), str(bad))
    assert r.returncode == 2 and r.stderr.startswith(f"sandboxd: {bad}:2:3: ")


def test_the_receipt_names_its_audit_record_arguments_and_policy(daemon: RunningDaemon) -> None:
    arguments = {"code": "print(1)"}
    result = daemon.invoke("python", arguments).json()
    denied = daemon.invoke("shell", {"command": "curl http://example.com"}).json()
    lines = daemon.audit_path.read_bytes().splitlines()
    records = audit_records(daemon.audit_path)
    for res in (result, denied):
        receipt = res["receipt"]
        line = lines[receipt["audit"]["seq"]]
        record = json.loads(line)
        assert (record["event"], record["request_id"]) == ("result", res["id"])
        assert hashlib.sha256(line).hexdigest() == receipt["audit"]["sha256"]
        (decision,) = [x for x in records if x["event"] == "decision"
                       and x["request_id"] == res["id"]]
        assert receipt["args_sha256"] == decision["args_sha256"]
        assert receipt["policy"]["rule"] == decision["rule"] == res["policy"]["rule"]
        policy = (embedded_policies_dir() / "default.yaml").read_bytes()
        assert receipt["policy"]["sha256"] == hashlib.sha256(policy).hexdigest()
    assert denied["status"] == "denied" and denied["receipt"]["status"] == "denied"
    assert result["receipt"]["args_sha256"] == hashlib.sha256(
        json.dumps(arguments, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_streamed_and_mcp_results_carry_the_receipt(daemon: RunningDaemon) -> None:
    keys = KeySet.from_document(keyset(daemon))
    with connect_sse(daemon.client, "POST", "/v1/tools/python/invoke",
                     json={"arguments": {"code": "print('streamed')"}},
                     headers={"Accept": "text/event-stream"}) as source:
        events = [(sse.event, json.loads(sse.data)) for sse in source.iter_sse()]
    (streamed,) = [data for kind, data in events if kind == "result"]
    assert streamed["receipt"]["transport"] == "http"
    assert check_receipt(streamed["receipt"], keys) is None
    assert check_result(streamed, streamed["receipt"]) == []
    mcp = RawMcp(daemon.url, daemon.headers)
    try:
        answer = mcp.call("python", {"code": "print('mcp')"})
    finally:
        mcp.close()
    structured = answer["result"]["structuredContent"]
    assert structured["receipt"]["transport"] == "mcp"
    assert check_receipt(structured["receipt"], keys) is None
    assert check_result(structured, structured["receipt"]) == []


def test_cutting_records_after_a_signed_head_is_reported(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as d:
        for i in range(3):
            assert d.invoke("python", {"code": f"print({i})"}).status_code == 200
        state, log = d.state_dir, d.audit_path
        assert d.stop() == 0  # the log's head is signed as it closes
    heads = Path(f"{log}.heads")
    (head,) = [json.loads(x) for x in heads.read_text().splitlines()]
    lines = log.read_bytes().splitlines(keepends=True)
    assert head["seq"] == len(lines) - 1 and head["reason"] == "close"
    r = sandboxd("audit", "verify", "--state-dir", str(state))
    assert r.returncode == 0 and f"matches the signed head at seq {head['seq']}" in r.stdout
    log.write_bytes(b"".join(lines[:-2]))  # the last two records removed
    r = sandboxd("audit", "verify", "--state-dir", str(state))
    assert r.returncode == 1, r.stdout
    assert (f"the log was cut: it ends at seq {head['seq'] - 2}, but a signed head names seq "
            f"{head['seq']}: 2 record(s) missing") in r.stdout
    as_json = json.loads(sandboxd("audit", "verify", "--json", "--state-dir",
                                  str(state)).stdout)
    assert (as_json["ok"], as_json["missing"], as_json["signed_seq"]) == (False, 2, head["seq"])
    log.write_bytes(b"".join(lines))
    forged = dict(head, seq=head["seq"] + 5)  # a head moved on without the key
    heads.write_text(heads.read_text() + json.dumps(forged) + "\n")
    r = sandboxd("audit", "verify", "--state-dir", str(state))
    assert r.returncode == 1 and "the signed head does not verify" in r.stdout


def test_a_log_named_alone_is_checked_with_its_own_keys(tmp_path: Path) -> None:
    """Another daemon's key set on the host (the admin's default) never judges a log named
    on the command line: the keys beside the log do, else none (a warning), else --key."""
    with running_daemon(tmp_path, state_dir=tmp_path / "state") as d:
        assert d.invoke("python", {"code": "print(1)"}).status_code == 200
        log = d.audit_path
        assert d.stop() == 0
    other = tmp_path / "other-daemon"
    SigningKey.open(other)  # the host's default daemon, with a key of its own
    host = dict(OFFLINE, SANDBOXD_STATE_DIR=str(other))
    r = sandboxd("audit", "verify", str(log), env=host)
    assert r.returncode == 0 and "matches the signed head" in r.stdout, r.stdout + r.stderr
    alone = tmp_path / "copied"
    alone.mkdir()
    for name in (log.name, f"{log.name}.heads"):
        (alone / name).write_bytes((log.parent / name).read_bytes())
    r = sandboxd("audit", "verify", str(alone / log.name), env=host)
    assert r.returncode == 0 and "no receipt keys to check" in r.stderr, r.stdout + r.stderr
    wrong = tmp_path / "wrong-keys.json"
    wrong.write_text(sandboxd("receipt", "key", "--state-dir", str(other)).stdout)
    r = sandboxd("audit", "verify", "--key", str(wrong), str(alone / log.name), env=host)
    assert r.returncode == 1 and "unknown key id" in r.stdout, r.stdout
    right = tmp_path / "keys.json"
    right.write_text(sandboxd("receipt", "key", "--state-dir", str(tmp_path / "state")).stdout)
    r = sandboxd("audit", "verify", "--key", str(right), str(alone / log.name), env=host)
    assert r.returncode == 0 and "matches the signed head" in r.stdout, r.stdout


def test_rotation_keeps_old_receipts_valid(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with running_daemon(tmp_path, state_dir=state) as d:
        old = d.invoke("python", {"code": "print('old')"}).json()
        assert d.stop() == 0
    r = sandboxd("receipt", "rotate", "--state-dir", str(state))
    assert r.returncode == 0 and r.stdout.startswith("new receipt key ")
    new_id = r.stdout.split()[3].rstrip(";")
    private = state / "receipts" / "signing.key"
    assert private.stat().st_mode & 0o777 == 0o600
    with running_daemon(tmp_path, state_dir=state) as d:
        new = d.invoke("python", {"code": "print('new')"}).json()
        served = keyset(d)
        assert d.stop() == 0
    assert new["receipt"]["key_id"] == new_id != old["receipt"]["key_id"]
    assert served["current"] == new_id and len(served["keys"]) == 2
    (retired,) = [k for k in served["keys"] if k["key_id"] == old["receipt"]["key_id"]]
    assert retired["retired"] is not None
    for name, result in (("old", old), ("new", new)):
        v = verify_file(tmp_path, result, served, name)
        assert v.returncode == 0, v.stdout
    # the heads signed by both keys still verify
    r = sandboxd("audit", "verify", "--state-dir", str(state))
    assert r.returncode == 0 and "matches the signed head" in r.stdout, r.stdout


def test_the_key_set_needs_a_token_like_every_v1_route(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    good = add_token(tokens, "alice")
    with running_daemon(tmp_path, env={"SANDBOXD_TOKENS_FILE": str(tokens)}, token=good) as d:
        assert httpx.get(f"{d.url}/v1/receipts/key", timeout=30).status_code == 401
        served = keyset(d)
        result = d.invoke("python", {"code": "print(1)"}).json()
    assert result["receipt"]["client"] == "alice"
    assert check_receipt(result["receipt"], KeySet.from_document(served)) is None


def test_a_periodic_head_finds_records_cut_after_a_crash(tmp_path: Path) -> None:
    """No head at stop (SIGKILL): the periodic one is what finds the cut."""
    env = {"SANDBOXD_AUDIT_HEAD_INTERVAL_S": "0.5"}
    with running_daemon(tmp_path, env=env) as d:
        seq = d.invoke("python", {"code": "print(1)"}).json()["receipt"]["audit"]["seq"]
        heads = Path(f"{d.audit_path}.heads")

        def signed_past_the_call() -> bool:
            return heads.exists() and any(json.loads(x)["seq"] >= seq
                                          for x in heads.read_text().splitlines())

        wait_until(signed_past_the_call, timeout=60, what="a periodic signed head")
        d.stop(signal.SIGKILL)
        state, log = d.state_dir, d.audit_path
    *_, head = [json.loads(x) for x in heads.read_text().splitlines()]
    assert head["reason"] == "periodic"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:head["seq"]]))  # the head's own record is cut too
    r = sandboxd("audit", "verify", "--state-dir", str(state))
    assert r.returncode == 1 and "1 record(s) missing" in r.stdout, r.stdout


def test_the_heads_file_keeps_its_newest_heads(tmp_path: Path, monkeypatch: Any) -> None:
    from sandboxd.receipts import sign
    from sandboxd.receipts.heads import last_head

    monkeypatch.setattr(sign, "HEADS_MAX_BYTES", 4096)
    monkeypatch.setattr(sign, "HEADS_KEPT", 5)
    receipts = sign.Receipts.open(tmp_path, tmp_path / "audit.jsonl", 60.0)
    for seq in range(60):
        receipts.sign_head(seq, f"{seq:064x}", "periodic")
    lines = (tmp_path / "audit.jsonl.heads").read_text().splitlines()
    # cut back to 5 whenever past 4 KiB (a head is over 200 bytes): the oldest are gone
    assert len(lines) <= 5 + 4096 // 200 and json.loads(lines[0])["seq"] > 0
    assert json.loads(lines[-1])["seq"] == 59
    head, problem = last_head(tmp_path / "audit.jsonl", receipts.key.keyset)
    assert problem is None and head is not None and head.seq == 59


@pytest.mark.parametrize("line", [b"5", b"[1, 2]", b'"head"', b"null", b"{"])
def test_a_heads_line_that_is_no_head_is_a_problem_not_a_crash(tmp_path: Path,
                                                               line: bytes) -> None:
    """Read with or without keys, a line of JSON that is not an object is reported as a
    corrupt head (it used to raise AttributeError when no keys were given)."""
    from sandboxd.receipts import sign
    from sandboxd.receipts.heads import last_head

    receipts = sign.Receipts.open(tmp_path, tmp_path / "audit.jsonl", 60.0)
    receipts.sign_head(0, f"{0:064x}", "periodic")
    with open(tmp_path / "audit.jsonl.heads", "ab") as heads:
        heads.write(line + b"\n")
    for keys in (None, receipts.key.keyset):
        _, problem = last_head(tmp_path / "audit.jsonl", keys)
        assert problem is not None and "not a signed head" in problem[1], (keys, problem)
