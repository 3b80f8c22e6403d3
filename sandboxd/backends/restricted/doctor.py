"""What ``sandboxd doctor`` prints for the restricted backend before probing it (registered
as its entry's ``doctor_rows`` and ``leftovers``): the cgroup facts and libseccomp, and the
probe leftovers its start-up sweep removes."""

from __future__ import annotations

import ctypes.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxd.models import ProbeCheck

if TYPE_CHECKING:
    from sandboxd.config import Settings


def _cgroup_facts(root: Path) -> list[ProbeCheck]:
    if (root / "cgroup.controllers").exists():
        from sandboxd.backends.restricted import cgroup_v2

        try:
            return [ProbeCheck(name="cgroup", ok=True, detail=cgroup_v2.plan(root))]
        except (OSError, cgroup_v2.CgroupUnavailable) as exc:
            return [ProbeCheck(name="cgroup", ok=False, detail=f"v2; {exc}")]
    controllers = [c for c in ("memory", "cpu", "pids") if (root / c).is_dir()]
    if not controllers:
        return [ProbeCheck(name="cgroup", ok=False, detail=f"no cgroup fs at {root}")]
    writable = [c for c in controllers if os.access(root / c, os.W_OK)]
    return [ProbeCheck(
        name="cgroup", ok=len(writable) == len(controllers),
        detail=f"v1; writable controllers: {', '.join(writable) or 'none'} of "
               f"{', '.join(controllers)}")]


def host_checks(settings: Settings) -> list[ProbeCheck]:
    """The cgroup layout the workers will get, and whether libseccomp is there."""
    lib = ctypes.util.find_library("seccomp")
    return [*_cgroup_facts(Path(settings.cgroup_root)),
            ProbeCheck(name="libseccomp", ok=lib is not None,
                       detail=lib or "not found (apt: libseccomp2)")]


def leftovers(settings: Settings) -> list[str]:
    """Probe workspaces a crashed daemon left in the state directory."""
    from sandboxd.backends.restricted.probe import PROBE_PREFIX

    return [str(p) for p in sorted(Path(settings.state_dir).glob(f"{PROBE_PREFIX}*"))]
