"""The one place backends are built from the settings: the daemon (:class:`~sandboxd.service.
Sandboxd`) and ``sandboxd doctor`` both use it, so the doctor probes exactly what the daemon
would run. Which backends exist, and how each is built, is the registry's
(:mod:`sandboxd.backends.registry`): nothing here names one."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sandboxd.backends import registry
from sandboxd.backends.base import Backend

if TYPE_CHECKING:
    from sandboxd.config import Settings
    from sandboxd.host.uids import UidPool

log = logging.getLogger("sandboxd")


def enabled_backends(settings: Settings) -> list[str]:
    """Names of the execution backends the settings enable, the default backend first."""
    return [e.name for e in registry.enabled(settings) if e.executes]


def build_backend(name: str, settings: Settings, uids: UidPool | None) -> Backend:
    """One backend, built the way the daemon builds it (ImportError when its dependencies are
    not installed, ValueError for an unknown name)."""
    entry = registry.get(name)
    if entry is None:
        raise ValueError(f"unknown backend {name!r} (choose "
                         f"{registry.quoted(registry.names(executes=True))})")
    return entry.build(settings, uids)


def build_backends(settings: Settings, uids: UidPool | None) -> dict[str, Backend]:
    """Every enabled backend that can be loaded (the file tools' one is always on);
    ``ValueError`` when a backend's settings section is wrong (:func:`registry.check_sections`)."""
    registry.check_sections(settings)
    backends: dict[str, Backend] = {}
    for entry in registry.enabled(settings):
        try:
            backends[entry.name] = entry.build(settings, uids)
        except ImportError as exc:  # pragma: no cover - depends on the install
            log.error("%s backend unavailable: %s", entry.name, exc)
    return backends
