"""Which clients' sessions a backend's ready sessions serve (:mod:`sandboxd.sessions.ready`):
those whose ``python`` tool runs on that backend in the sandbox a ready session holds (the
backend's own image, no network, no egress rules); the rule is PolicyStore.runs_python_on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.policy.helpers import BASE, store_for, write

PLAIN = """\
tools:
  python:
    backend: container
"""


def test_a_plain_container_python_is_served(tmp_path: Path) -> None:
    store = store_for(tmp_path, PLAIN)
    assert store.runs_python_on("container")
    assert store.runs_python_on("container", "anyone")
    assert not store.runs_python_on("restricted")
    assert not store.runs_python_on("restricted", "anyone")


@pytest.mark.parametrize("extra", [
    "    image: sandboxd/datascience:latest\n",  # its own image: a ready one has another
    "    network: bridge\n",  # a network: a ready one has none
    "    egress: {allow: ['api.example.com:443']}\n",  # egress rules: it has no proxy
    "    enabled: false\n",
])
def test_a_python_a_ready_session_cannot_hold_is_not_served(tmp_path: Path,
                                                            extra: str) -> None:
    store = store_for(tmp_path, PLAIN + extra)
    assert not store.runs_python_on("container")
    assert not store.runs_python_on("container", "anyone")


def test_a_policy_wide_network_counts_too(tmp_path: Path) -> None:
    store = store_for(tmp_path, "network: bridge\n" + PLAIN)
    assert not store.runs_python_on("container")


def test_each_client_by_its_own_policy(tmp_path: Path) -> None:
    d = tmp_path / "policies"
    write(d, "a.yaml", BASE.format(name="a", clients='["alice"]') + PLAIN)
    store = store_for(tmp_path, "tools:\n  python:\n    backend: restricted\n", name="b",
                      clients='["*"]')
    assert store.runs_python_on("container")  # alice's
    assert store.runs_python_on("container", "alice")
    assert not store.runs_python_on("container", "bob")
    assert store.runs_python_on("restricted", "bob")
