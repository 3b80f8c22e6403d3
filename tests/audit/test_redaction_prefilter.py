"""The redaction prefilter (every string of every record is redacted): a string none of whose
substrings can start a secret pattern is returned after one scan. It must see every secret the
patterns redact: one sample per pattern, each redacted, and every pattern has its sample."""

from __future__ import annotations

import pytest

from sandboxd.audit import encoding

#: one sample per entry of encoding._SECRET_TEXT, in its order
SAMPLES = [
    "x -----BEGIN RSA PRIVATE KEY-----\nabc\n-----END RSA PRIVATE KEY----- y",
    "Authorization: Bearer abcdefgh12345678",
    "key AKIAIOSFODNN7EXAMPLE here",
    "sk-abcdefghijklmnopqrstuvwx",
    "ghp_abcdefghijklmnopqrstuvwxyz0123",
    "github_pat_abcdefghijklmnopqrstuvwxyz",
    "glpat-abcdefghijklmnopqrstu",
    "xoxb-1234567890-abc",
    "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    "sbx_0123456789abcdefghijklmnop",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abcdefghijklmnop",
    "https://bob:hunter2hunter2@example.com/",
    "PASSWORD=s3cr3tP4ss",
]


def test_every_pattern_has_a_sample() -> None:
    assert len(SAMPLES) == len(encoding._SECRET_TEXT)


@pytest.mark.parametrize("index", range(len(SAMPLES)))
def test_the_prefilter_sees_each_patterns_sample(index: int) -> None:
    pattern, _ = encoding._SECRET_TEXT[index]
    sample = SAMPLES[index]
    assert pattern.search(sample), "the sample must match its own pattern"
    assert encoding._MAY_HOLD_SECRET.search(sample)
    # also in other case (the case-insensitive patterns) and inside other text
    for variant in (sample.upper(), sample.lower(), f"print({sample!r})"):
        if pattern.search(variant):
            assert encoding._MAY_HOLD_SECRET.search(variant), variant
    assert encoding.redact_text(sample) != sample


def test_plain_text_is_returned_as_it_is() -> None:
    text = "x += 1; print(x)"
    assert encoding._MAY_HOLD_SECRET.search(text) is None
    assert encoding.redact_text(text) is text


def test_the_prefilter_changes_nothing_on_the_projects_own_text() -> None:
    """Every line of the tests and docs (secrets of every kind among them), redacted with and
    without the prefilter: the same."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    lines = {line for path in [*root.glob("tests/**/*.py"), *root.glob("docs/*.md")]
             for line in path.read_text(errors="replace").splitlines()}
    changed = 0
    for line in lines:
        full = line
        for pattern, replacement in encoding._SECRET_TEXT:
            full = pattern.sub(replacement, full)
        assert encoding.redact_text(line) == full, line
        changed += full != line
    assert changed > 20  # the corpus does hold secrets


def _expand(alternative: str) -> set[str]:
    """The strings one alternative of the prefilter regex matches: literals, ``[..]`` and
    ``[..]?`` (all it uses), lower case."""
    out = {""}
    i = 0
    while i < len(alternative):
        if alternative[i] == "[":
            end = alternative.index("]", i)
            choices = set(alternative[i + 1:end])
            i = end + 1
            if i < len(alternative) and alternative[i] == "?":
                choices.add("")
                i += 1
        else:
            choices = {alternative[i]}
            i += 1
        out = {o + c for o in out for c in choices}
    return {o.lower() for o in out}


def test_the_needles_are_the_regexs_alternatives() -> None:
    expanded = set().union(*map(_expand, encoding._MAY_HOLD_SECRET.pattern.split("|")))
    assert expanded == set(encoding._NEEDLES)


def test_the_fast_prefilter_agrees_with_the_regex() -> None:
    """On ASCII text of every length (short: one regex; long: one ``in`` per needle) and in
    every case; non-ASCII text is the regex's (the long s U+017F and the Kelvin sign fold to
    ASCII letters)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    lines = sorted({line for path in [*root.glob("tests/**/*.py"), *root.glob("docs/*.md")]
                    for line in path.read_text(errors="replace").splitlines()})
    text = "\n".join(lines)
    corpus = [*lines, *SAMPLES, *(text[i:i + 300] for i in range(0, len(text), 150))]
    for needle in encoding._NEEDLES:
        for variant in (needle, needle.upper(), needle.title(), needle.swapcase()):
            corpus += [variant, f"x{variant}y", f"{'.' * 300}{variant}", f"{variant}{'.' * 300}"]
    corpus += ["pa\u017fsword=s3cr3tP4ss", "\u212aey", "ok", ""]
    seen = 0
    for item in corpus:
        expected = encoding._MAY_HOLD_SECRET.search(item) is not None
        assert encoding.may_hold_secret(item) is expected, item[:400]
        seen += expected
    assert 0 < seen < len(corpus)
    assert encoding.redact_text("PA\u017fSWORD=s3cr3tP4ss") != "PA\u017fSWORD=s3cr3tP4ss"


def test_the_answers_for_keys_are_remembered_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same answer the first time and from memory; never more than the bound, never a long
    key (argument names are the caller's)."""
    monkeypatch.setattr(encoding, "_KEY_ANSWERS", {})
    keys = ["password", "api_key", "token_sha256", "session_id", "client", "tool", "x.secret",
            "authorization", "args_sha256", "Token", "my-private-key", "k" * 65]
    for key in keys * 2:
        expected = (encoding._SECRET_KEY.search(key) is not None
                    and not encoding._CREDENTIAL_DIGEST_KEY.match(key))
        assert encoding._secret_key(key) is expected, key
    assert "k" * 65 not in encoding._KEY_ANSWERS
    for i in range(encoding._KEY_ANSWERS_MAX + 100):
        encoding._secret_key(f"key{i}")
    assert len(encoding._KEY_ANSWERS) == encoding._KEY_ANSWERS_MAX
    assert encoding.redact({"password": "hunter2", "tool": "x"}) == {
        "password": encoding.REDACTED, "tool": "x"}
