"""Helpers for policy tests: write policy files, build stores."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from sandboxd.models import Decision, LimitsRequest
from sandboxd.policy import PolicyStore

BASE = """\
version: 1
name: {name}
clients: {clients}
"""


def write(directory: Path, name: str, body: str) -> Path:
    """Write a policy file (``body`` is dedented)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(body))
    return path


def store_for(tmp_path: Path, body: str, *, name: str = "p", clients: str = '["*"]') -> PolicyStore:
    """A loaded store over one policy file made of the base header plus ``body``."""
    d = tmp_path / "policies"
    write(d, f"{name}.yaml", BASE.format(name=name, clients=clients) + textwrap.dedent(body))
    store = PolicyStore(d)
    store.load()
    return store


def decide(store: PolicyStore, tool: str, arguments: dict[str, Any], client: str = "local",
           limits: LimitsRequest | None = None) -> Decision:
    return store.decide(client, tool, arguments, limits)
