"""Token labels, expiry and revocation of one token, through the file, the CLI and the
daemon's app in process (tests/support/inprocess.py); the per-client rate limit as the API
applies it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from sandboxd.access.tokens import (
    TokenFileError,
    TokenStore,
    add_token,
    hash_token,
    remove_token_by_id,
)
from sandboxd.cli.token import parse_expiry
from tests.auth.test_tokens import run_cli
from tests.support.audit import audit_records
from tests.support.inprocess import inprocess_daemon
from tests.support.wait import wait_until


def test_label_and_expiry_are_stored_and_expired_tokens_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    soon = datetime.now(UTC) + timedelta(seconds=2)
    token = add_token(path, "alice", label="laptop agent", expires=soon)
    entry = yaml.safe_load(path.read_text())["tokens"][0]
    assert entry["label"] == "laptop agent"
    assert entry["expires"] == soon.replace(microsecond=0).isoformat().replace("+00:00", "Z")
    store = TokenStore.load(path)
    assert store.client_for(token) == "alice"
    later = datetime.now(UTC) + timedelta(seconds=5)
    assert store.entry_for(token).expired(later)  # type: ignore[union-attr]
    assert not store.entry_for(token).expired(datetime.now(UTC) - timedelta(1))  # type: ignore[union-attr]


def test_expiry_in_the_past_and_bad_labels_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    with pytest.raises(TokenFileError, match="not in the future"):
        add_token(path, "alice", expires=datetime.now(UTC) - timedelta(seconds=1))
    with pytest.raises(TokenFileError, match="label"):
        add_token(path, "alice", label="line\nbreak")
    assert not path.exists()


def test_bad_expiry_in_the_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(f"tokens:\n  - client: a\n    sha256: {'0' * 64}\n    expires: soon\n")
    path.chmod(0o600)
    with pytest.raises(TokenFileError, match=r"tokens.yaml:4:14: expires must be an ISO 8601"):
        TokenStore.load(path)


@pytest.mark.parametrize(("text", "delta"), [("30d", timedelta(days=30)),
                                             ("12h", timedelta(hours=12)),
                                             ("90m", timedelta(minutes=90)),
                                             ("2w", timedelta(weeks=2))])
def test_expiry_durations(text: str, delta: timedelta) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_expiry(text, now) == now + delta


def test_expiry_dates_and_garbage() -> None:
    assert parse_expiry("2027-01-31") == datetime(2027, 1, 31, tzinfo=UTC)
    assert parse_expiry("2027-01-31T12:00:00+02:00") == datetime(2027, 1, 31, 10, tzinfo=UTC)
    for bad in ("tomorrow", "0d", "5y", ""):
        with pytest.raises(ValueError, match="--expires"):
            parse_expiry(bad)


def test_remove_by_id_revokes_exactly_one_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    first = add_token(path, "alice", label="one")
    second = add_token(path, "alice", label="two")
    removed = remove_token_by_id(path, "sha256:" + hash_token(first)[:8])
    assert removed.label == "one"
    store = TokenStore.load(path)
    assert store.client_for(first) is None and store.client_for(second) == "alice"
    for bad, why in (("abc", "at least 6"), ("zzzzzzzz", "at least 6"),
                     (hash_token(first)[:12], "no token with id")):
        with pytest.raises(TokenFileError, match=why):
            remove_token_by_id(path, bad)


def test_cli_add_with_label_and_expiry_list_and_remove_by_id(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    r = run_cli("add", "alice", "--label", "ci runner", "--expires", "30d",
                "--tokens-file", str(path))
    assert r.returncode == 0, r.stderr
    kept = run_cli("add", "alice", "--tokens-file", str(path)).stdout.strip()
    token = r.stdout.strip()
    listing = run_cli("list", "--tokens-file", str(path)).stdout
    row = next(line for line in listing.splitlines() if hash_token(token)[:12] in line)
    assert "ci runner" in row and "never" not in row
    assert (datetime.now(UTC) + timedelta(days=30)).strftime("%Y-%m-%d") in row
    r = run_cli("add", "bob", "--expires", "next week", "--tokens-file", str(path))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--expires" in r.stderr
    r = run_cli("remove", "--id", hash_token(token)[:10], "--tokens-file", str(path))
    assert r.returncode == 0, r.stderr
    assert "ci runner" in r.stdout
    store = TokenStore.load(path)
    assert store.client_for(token) is None and store.client_for(kept) == "alice"
    r = run_cli("remove", "alice", "--id", "abcdef", "--tokens-file", str(path))
    assert r.returncode == 2 and "not both" in r.stderr


def test_daemon_refuses_an_expired_token_and_revokes_one_by_id(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    other = add_token(tokens, "alice", label="other")
    with inprocess_daemon(tmp_path, env={"SANDBOXD_TOKENS_FILE": str(tokens)},
                          token=other) as d:
        def status(token: str) -> int:
            return d.anon.get("/v1/tools", timeout=30,
                              headers={"Authorization": f"Bearer {token}"}).status_code

        # added while the daemon runs (picked up within a second), valid for 8 s
        short = add_token(tokens, "alice", label="short",
                          expires=datetime.now(UTC) + timedelta(seconds=8))
        seen = set()

        def refused_after_valid() -> bool:
            code = status(short)
            seen.add(code)
            return code == 401 and 200 in seen

        wait_until(refused_after_valid, timeout=30, interval=0.2,
                   what="the short-lived token to be accepted, then refused")
        assert 200 in seen and 401 in seen  # valid once picked up, refused once expired
        r = d.anon.get("/v1/tools", timeout=30,
                       headers={"Authorization": f"Bearer {short}"})
        assert r.status_code == 401 and "expired token" in r.json()["detail"]
        assert status(other) == 200
        remove_token_by_id(tokens, hash_token(other)[:12])
        wait_until(lambda: status(other) != 200, timeout=10, interval=0.2,
                   what="the revoked token to be refused")
        assert status(other) == 401  # revoked without a restart
    records = audit_records(d.audit_path)
    failures = [r for r in records if r["event"] == "auth_failure"]
    assert sum(r["expired"] for r in failures) >= 2
    assert sum(r["unknown"] for r in failures) >= 1
    assert hash_token(short)[:12] in {x for r in failures for x in r["digests"]}


def test_rate_limit_applies_to_token_holders_and_says_which_limit(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    token = add_token(tokens, "alice")
    env = {"SANDBOXD_TOKENS_FILE": str(tokens), "SANDBOXD_RATE_LIMIT_PER_MINUTE": "3"}
    with inprocess_daemon(tmp_path, env=env, token=token) as d:
        codes = [d.client.get("/v1/tools").status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        r = d.client.get("/v1/tools")
        body = r.json()
        assert r.status_code == 429 and body["limit"] == "rate_limit_per_minute"
        assert body["limit_value"] == 3 and "3 calls in the last 60 s" in body["detail"]
        assert 50 <= int(r.headers["retry-after"]) <= 60


def test_the_tokenless_loopback_client_is_not_rate_limited(tmp_path: Path) -> None:
    with inprocess_daemon(tmp_path, env={"SANDBOXD_RATE_LIMIT_PER_MINUTE": "3"}) as d:
        codes = {d.client.get("/v1/tools").status_code for _ in range(10)}
        assert codes == {200}
