"""What the restricted backend needs from the daemon's settings, and nothing more."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandboxd.config import Settings


@dataclass(frozen=True)
class RestrictedConfig:
    """The restricted backend's own settings (built from the daemon's by
    :meth:`from_settings`)."""

    state_dir: Path  # probe workspaces live here, where a crash's leftovers are swept
    instance_name: str  # names this daemon's cgroups
    cgroup_root: Path = Path("/sys/fs/cgroup")
    enabled: bool = True
    standby_workers: int = 4  # forked, prepared workers kept ready (one per scheduler slot)
    sandbox_uid_first: int = 10100  # the uid pool's range, when the backend makes its own
    sandbox_uid_count: int = 900
    kernel_interrupt_grace_s: float = 2.0  # an interrupted kernel may come back this long

    @classmethod
    def from_settings(cls, settings: Settings) -> RestrictedConfig:
        """The restricted backend's part of the daemon's settings."""
        return cls(state_dir=settings.state_dir, instance_name=settings.instance_name,
                   cgroup_root=Path(settings.cgroup_root),
                   enabled=settings.restricted_enabled,
                   standby_workers=settings.max_concurrency,
                   sandbox_uid_first=settings.sandbox_uid_first,
                   sandbox_uid_count=settings.sandbox_uid_count,
                   kernel_interrupt_grace_s=settings.kernel_interrupt_grace_s)
