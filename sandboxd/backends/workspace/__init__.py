"""The ``workspace`` backend: the file tools, in the daemon (:mod:`.backend`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sandboxd.backends.registry import BackendEntry, register

if TYPE_CHECKING:
    from sandboxd.backends.workspace.backend import WorkspaceBackend

ENTRY = register(BackendEntry(
    name="workspace",
    factory="sandboxd.backends.workspace.backend:WorkspaceBackend.from_settings",
    serves=frozenset({"files"}), defaults=frozenset({"files"}),
    settings=("session_quota_bytes", "session_quota_entries"),
    executes=False,
))


def __getattr__(name: str) -> Any:
    """The backend module's names on first use (registering the entry imports none of it)."""
    if name.startswith("__") or name == "backend":  # "backend": the submodule, being imported
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return getattr(importlib.import_module(f"{__name__}.backend"), name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


__all__ = ["ENTRY", "WorkspaceBackend"]
