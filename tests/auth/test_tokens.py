"""Tokens: stored hashed only, file 0600, errors with file:line, CLI prints the token once."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from sandboxd.access.tokens import TokenFileError, TokenStore, add_token, hash_token, remove_tokens
from tests.support import cli


def test_add_token_stores_only_the_hash(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "tokens.yaml"
    token = add_token(path, "alice")
    assert token.startswith("sbx_") and len(token) >= 40
    text = path.read_text()
    assert token not in text and token[4:] not in text
    assert hashlib.sha256(token.encode()).hexdigest() in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    store = TokenStore.load(path)
    assert store.client_for(token) == "alice"
    assert store.client_for(token + "x") is None
    assert store.client_for("") is None
    assert store.client_for(hash_token(token)) is None  # the hash is not a token


def test_many_tokens_and_clients(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    tokens = {name: add_token(path, name) for name in ("alice", "bob", "ci-runner.1")}
    second = add_token(path, "alice")
    store = TokenStore.load(path)
    for name, token in tokens.items():
        assert store.client_for(token) == name
    assert store.client_for(second) == "alice"
    assert store.clients() == ["alice", "bob", "ci-runner.1"]
    assert remove_tokens(path, "alice") == 2
    store = TokenStore.load(path)
    assert store.client_for(second) is None and store.client_for(tokens["bob"]) == "bob"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_invalid_client_name(tmp_path: Path) -> None:
    with pytest.raises(TokenFileError, match="not a valid client name"):
        add_token(tmp_path / "t.yaml", "../etc")
    assert not (tmp_path / "t.yaml").exists()


@pytest.mark.parametrize(("text", "where", "fragment"), [
    ("tokens:\n  - client: a\n    sha256: zz\n", "3:13", "sha256 must be 64 lowercase hex"),
    ("tokens:\n  - client: a b\n    sha256: " + "a" * 64 + "\n", "2:13", "client must be a name"),
    ("tokens:\n  - client: a\n    token: abc\n", "3:5", "unknown key"),
    ("tokens:\n  - client: a\n    sha256: " + "a" * 64 + "\n  - client: b\n    sha256: "
     + "a" * 64 + "\n", "5:13", "duplicate token hash (first on line 3)"),
    ("tokens: [\n", "2:1", "YAML syntax error"),
    ("tokens: 3\n", "1:9", "'tokens' must be a list"),
    ("users: []\n", "1:1", "unknown key"),
])
def test_file_errors_have_line_and_column(tmp_path: Path, text: str, where: str,
                                          fragment: str) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    with pytest.raises(TokenFileError) as info:
        TokenStore.load(path)
    assert str(info.value).startswith(f"{path}:{where}: ")
    assert fragment in str(info.value)


def test_empty_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    assert TokenStore.load(tmp_path / "empty.yaml").entries == []
    with pytest.raises(TokenFileError, match="cannot read tokens file"):
        TokenStore.load(tmp_path / "missing.yaml")


def test_add_refuses_to_rewrite_a_broken_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text("tokens: [\n")
    with pytest.raises(TokenFileError):
        add_token(path, "alice")
    assert path.read_text() == "tokens: [\n"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return cli.run("token", *args,
                   env={"PATH": "/usr/bin:/bin", "SANDBOXD_CONFIG": "/nonexistent"})


def test_cli_add_prints_token_once_and_stores_hash(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    r = run_cli("add", "alice", "--tokens-file", str(path))
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    assert token.startswith("sbx_") and "\n" not in token
    assert "shown once" in r.stderr
    assert token not in path.read_text()
    assert TokenStore.load(path).client_for(token) == "alice"
    r = run_cli("list", "--tokens-file", str(path))
    rows = r.stdout.splitlines()
    assert rows[0].split()[:2] == ["CLIENT", "ID"]
    assert rows[1].split()[:2] == ["alice", hash_token(token)[:12]]
    assert token not in r.stdout
    r = run_cli("remove", "alice", "--tokens-file", str(path))
    assert r.returncode == 0 and TokenStore.load(path).entries == []
    r = run_cli("remove", "alice", "--tokens-file", str(path))
    assert r.returncode == 1 and "no token for client" in r.stderr


def test_cli_add_uses_settings_tokens_file(tmp_path: Path) -> None:
    path = tmp_path / "from-env.yaml"
    r = cli.run("token", "add", "bob",
                env={"PATH": "/usr/bin:/bin", "SANDBOXD_CONFIG": "/nonexistent",
                     "SANDBOXD_TOKENS_FILE": str(path)})
    assert r.returncode == 0, r.stderr
    assert TokenStore.load(path).client_for(r.stdout.strip()) == "bob"
    assert os.stat(path).st_mode & 0o077 == 0


def test_store_reloads_when_the_file_changes(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                             ) -> None:
    path = tmp_path / "tokens.yaml"
    alice = add_token(path, "alice")
    store = TokenStore.load(path)
    store.CHECK_INTERVAL_S = 0.0
    bob = add_token(path, "bob")
    assert store.client_for(bob) == "bob"  # added without a restart
    remove_tokens(path, "alice")
    assert store.client_for(alice) is None  # revoked without a restart
    good = path.read_text()
    path.write_text(good + "  - oops\n")  # a broken edit: logged, previous tokens stay
    assert store.client_for(bob) == "bob"
    assert "previous tokens stay in force" in caplog.text
    path.write_text(good)
    assert store.client_for(bob) == "bob"


def test_writable_tokens_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    add_token(path, "alice")
    path.chmod(0o664)
    with pytest.raises(TokenFileError, match=r"writable by group or others \(mode 0664\)"):
        TokenStore.load(path)
    with pytest.raises(TokenFileError):
        add_token(path, "bob")  # nor is it silently fixed
    path.chmod(0o644)
    assert TokenStore.load(path).clients() == ["alice"]
