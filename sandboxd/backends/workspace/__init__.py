"""The ``workspace`` backend: the file tools, in the daemon (:mod:`.backend`)."""

from __future__ import annotations

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
    if name.startswith("__"):
        raise AttributeError(name)
    from sandboxd.backends.workspace import backend

    return getattr(backend, name)


__all__ = ["ENTRY", "WorkspaceBackend"]
