"""The redaction prefilter (issue 25): a string none of whose substrings can start a secret
pattern is returned after one scan. It must see every secret the patterns redact: one sample
per pattern, each redacted, and every pattern has its sample."""

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
