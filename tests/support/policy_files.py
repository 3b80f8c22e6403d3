"""Policy directories for test daemons whose calls need more time than the shipped policy's
default gives (60 s): a request can only lower a policy's default (``effective_limits``), so a
test that asks for more gets 60 s unless its daemon's policy says otherwise."""

from __future__ import annotations

from pathlib import Path

from sandboxd.policy.store import embedded_policies_dir

#: the shipped policy's default call limit, as its file writes it
SHIPPED_DEFAULT = "\n  timeout: 60s\n"


def long_calls_policy(tmp_path: Path, seconds: int) -> Path:
    """A policy directory under ``tmp_path``: the shipped policy with a default call limit of
    ``seconds`` (at most its ``max_timeout``)."""
    text = (embedded_policies_dir() / "default.yaml").read_text()
    assert text.count(SHIPPED_DEFAULT) == 1, "the shipped policy's default limit moved"
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "default.yaml").write_text(
        text.replace(SHIPPED_DEFAULT, f"\n  timeout: {seconds}s\n"))
    return policies
