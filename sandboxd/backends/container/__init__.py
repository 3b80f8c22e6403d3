"""The container backend: Docker containers with a warm pool and fork-per-call session
containers (see :mod:`sandboxd.backends.container.backend`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandboxd.backends.registry import BackendEntry, register

if TYPE_CHECKING:
    from sandboxd.backends.container.backend import ContainerBackend

ENTRY = register(BackendEntry(
    name="container",
    factory="sandboxd.backends.container.backend:ContainerBackend.from_settings",
    serves=frozenset({"python", "shell", "custom"}), defaults=frozenset({"shell", "custom"}),
    enabled_setting="container_enabled",
    config="sandboxd.backends.container.config:ContainerConfig",
    network=True,
    doctor_rows="sandboxd.backends.container.doctor:host_checks",
    leftovers="sandboxd.backends.container.doctor:leftovers",
))


def __getattr__(name: str) -> Any:
    """``ContainerBackend`` on first use: registering the entry imports neither the backend
    nor the Docker SDK."""
    if name == "ContainerBackend":
        from sandboxd.backends.container.backend import ContainerBackend

        return ContainerBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ENTRY", "ContainerBackend"]
