"""The one place backends are built from the settings: the daemon (:class:`~sandboxd.service.
Sandboxd`) and ``sandboxd doctor`` both use it, so the doctor probes exactly what the daemon
would run."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sandboxd.backends.base import Backend

if TYPE_CHECKING:
    from sandboxd.config import Settings
    from sandboxd.uids import UidPool

log = logging.getLogger("sandboxd")

#: the backend that must prove its confinement for the daemon to serve
DEFAULT_BACKEND = "restricted"
#: the execution backends, in the order the doctor and readiness list them
EXECUTION_BACKENDS = ("restricted", "container")


def enabled_backends(settings: Settings) -> list[str]:
    """Names of the execution backends the settings enable, the default backend first."""
    names = [name for name in EXECUTION_BACKENDS if getattr(settings, f"{name}_enabled")]
    return sorted(names, key=lambda n: n != DEFAULT_BACKEND)


def build_backend(name: str, settings: Settings, uids: UidPool | None) -> Backend:
    """One execution backend, built the way the daemon builds it (ImportError when its
    dependencies are not installed, ValueError for an unknown name)."""
    if name == "restricted":
        from sandboxd.backends.restricted import RestrictedBackend

        return RestrictedBackend.from_settings(settings, uids)
    if name == "container":
        from sandboxd.backends.container import ContainerBackend

        return ContainerBackend.from_settings(settings, uids)
    raise ValueError(f"unknown backend {name!r} (choose {' or '.join(EXECUTION_BACKENDS)})")


def build_backends(settings: Settings, uids: UidPool | None) -> dict[str, Backend]:
    """The file-tool backend and every enabled execution backend that can be loaded."""
    from sandboxd.backends.workspace import WorkspaceBackend

    backends: dict[str, Backend] = {"workspace": WorkspaceBackend(
        quota_bytes=settings.session_quota_bytes, quota_entries=settings.session_quota_entries)}
    for name in enabled_backends(settings):
        try:
            backends[name] = build_backend(name, settings, uids)
        except ImportError as exc:  # pragma: no cover - depends on the install
            log.error("%s backend unavailable: %s", name, exc)
    return backends
