"""The restricted backend: RestrictedPython inside a confined, pre-forked worker process.

Two layers, each of which must hold on its own:

* :mod:`.lang` - the language layer (a package: compile step, allowlists, guards, module
  proxies, output cap, workspace-confined ``open``), running inside the worker;
* :mod:`.confine` / :mod:`.zygote` - the process layer: a single-threaded zygote forks one
  fresh worker per call, which confines itself (process group, cgroup, chroot, no_new_privs,
  unprivileged uid, rlimits, seccomp) before compiling the user's code; one module per
  mechanism (:mod:`.cgroups`, :mod:`.contain`, :mod:`.landlock`, :mod:`.seccomp`,
  :mod:`.namespaces`), :mod:`.confine` keeps their order;
* :mod:`.backend` - :class:`RestrictedBackend`, the daemon side (``Backend`` protocol), with
  :mod:`.zygote_client`, :mod:`.standby`, :mod:`.outcome` and :mod:`.probe`; its functions
  take one call as one object (:mod:`.worker_call`). A worker checks its own confinement
  for the probe with :mod:`.self_test`.

Choices worth knowing (details in the module docstrings):

* a compile refusal (RestrictedPython error or syntax error) is status ``error`` with the
  errors in stderr, like any exception, so that a model can fix its code; ``rejected`` is only
  used for a request this backend cannot run at all (not python code);
* workers can start neither processes nor threads (seccomp denies every ``clone``);
* as root, a worker is chrooted into its workspace and runs as its sandbox's own uid (= gid)
  of the pool (:mod:`sandboxd.host.uids`);
  Landlock (when the kernel has it) confines the filesystem to the workspace in every mode and is
  the filesystem boundary when the daemon does not run as root (then the worker keeps the
  daemon's uid, and cgroups are used only if a writable/delegated subtree exists);
* the zygote keeps one prepared standby worker per scheduler slot (one while idle); the daemon
  writes a call straight to its worker's socket and kills through a pidfd; a worker's exit is
  reported (and ``cleanup.verified`` set: reaped, its cgroup empty, /proc agreeing) before its
  cgroup directory is removed, which is retried and swept at start-up and close;
* a module the policy allows is importable only if this backend has a name allowlist for it
  (see ``lang.module_allowlist``); ``typing`` and ``dataclasses`` are deliberately absent (they
  ``eval``/``exec`` strings in host context).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandboxd.backends.registry import BackendEntry, register

if TYPE_CHECKING:
    from sandboxd.backends.restricted.backend import RestrictedBackend

ENTRY = register(BackendEntry(
    name="restricted",
    factory="sandboxd.backends.restricted.backend:RestrictedBackend.from_settings",
    serves=frozenset({"python"}), defaults=frozenset({"python"}),
    enabled_setting="restricted_enabled",
    config="sandboxd.backends.restricted.config:RestrictedConfig",
    startup_probe=True,
    imports="sandboxd.backends.restricted.offered:OFFERED_MODULES",
    doctor_rows="sandboxd.backends.restricted.doctor:host_checks",
    leftovers="sandboxd.backends.restricted.doctor:leftovers",
))


def __getattr__(name: str) -> Any:
    """``RestrictedBackend`` on first use: registering the entry imports no backend code."""
    if name == "RestrictedBackend":
        from sandboxd.backends.restricted.backend import RestrictedBackend

        return RestrictedBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ENTRY", "RestrictedBackend"]
