"""Execution backends: ``restricted`` (RestrictedPython in a confined worker), ``container``
(Docker), and ``workspace`` (file tools, in-daemon with descriptor-based path confinement).
Each subpackage registers itself in :mod:`.registry`, which the rest of the daemon asks."""

from sandboxd.backends.base import Backend, BackendUnavailable

__all__ = ["Backend", "BackendUnavailable"]
