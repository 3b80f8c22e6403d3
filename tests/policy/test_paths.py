"""Path normalisation and glob matching of the file-tool path rules."""

from __future__ import annotations

import pytest

from sandboxd.policy.paths import PathRefused, compile_glob, glob_match, normalise


@pytest.mark.parametrize(("raw", "norm"), [
    ("a", "a"), ("./a//b/", "a/b"), (".", "."), ("", "."), ("./", "."), ("a/./b", "a/b"),
    ("~/x", "~/x"), ("a\\b", "a\\b"), ("/workspace", "."), ("/workspace/a/", "a"),
    ("a b/c d", "a b/c d"), ("café", "café"),
])
def test_normalise(raw: str, norm: str) -> None:
    assert normalise(raw) == norm


@pytest.mark.parametrize("raw", [
    "/etc/passwd", "..", "a/../b", "a/..", "x\x00y", "a" * 5000, "/workspace/../x",
    # refused, never cleaned: padded or invisible twins of protected names, non-NFC text
    "app.key ", " .git/hooks/x", "a/ b", "a /b", ".env\n", ".env\t", ".env\x1b[0m", ".env\x85",
    ".env\u00a0", ".env\u2028", ".env\u200b", ".env\u202e", ".env\ufeff", "a\ud800",
    "cafe\u0301",
])
def test_normalise_refuses(raw: str) -> None:
    with pytest.raises(PathRefused):
        normalise(raw)


@pytest.mark.parametrize(("pattern", "path", "matches"), [
    ("**", ".", True), ("**", "a/b/c", True), ("*", "a", True), ("*", "a/b", False),
    ("**/.env", ".env", True), ("**/.env", "a/b/.env", True), ("**/.env", "a/.envx", False),
    ("*.py", ".hidden.py", True), ("src/**/*.py", "src/x.py", True),
    ("src/**/*.py", "src/a/b/x.py", True), ("src/**/*.py", "x.py", False),
    ("data/**", "data/a", True), ("data/**", "data", False), ("a?c", "abc", True),
    ("a?c", "a/c", False), ("[ab].txt", "a.txt", True), ("[!ab].txt", "c.txt", True),
    ("[!ab].txt", "a.txt", False), ("[!a]", "/", False), ("x[", "x[", True),
    ("a.b", "axb", False), ("(a)+", "(a)+", True),
])
def test_glob(pattern: str, path: str, matches: bool) -> None:
    assert glob_match(pattern, path) is matches


def test_repeated_double_stars_collapse() -> None:
    """``**/**/**/x`` would backtrack polynomially on long paths; it is compiled as ``**/x``."""
    assert compile_glob("**/**/**/**/x").pattern == compile_glob("**/x").pattern
    assert compile_glob("a/****/b").pattern == compile_glob("a/**/b").pattern
    assert glob_match("**/**/**/x", "/".join(["a"] * 2000) + "/x")
