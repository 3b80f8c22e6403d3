"""What the restricted backend needs from the daemon's settings, and nothing more."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxd.backends.settings import from_settings, reads
from sandboxd.protocol.limits import FORK_STATE_BYTES

if TYPE_CHECKING:
    from sandboxd.config import Settings


@dataclass(frozen=True)
class RestrictedConfig:
    """The restricted backend's own settings: each field names the daemon setting it is read
    from (:mod:`sandboxd.backends.settings`; its defaults serve a config built directly)."""

    # probe workspaces live here, where a crash's leftovers are swept
    state_dir: Path = field(metadata=reads())
    # names this daemon's cgroups
    instance_name: str = field(metadata=reads("instance", "state_dir",
                                              derive=lambda s: s.instance_name))
    cgroup_root: Path = field(default=Path("/sys/fs/cgroup"), metadata=reads())
    enabled: bool = field(default=True, metadata=reads("restricted_enabled"))
    # forked, prepared workers kept ready (one per scheduler slot)
    standby_workers: int = field(default=4, metadata=reads("max_concurrency"))
    # the uid pool's range, when the backend makes its own
    sandbox_uid_first: int = field(default=10100, metadata=reads())
    sandbox_uid_count: int = field(default=900, metadata=reads())
    # an interrupted kernel may come back this long
    kernel_interrupt_grace_s: float = field(default=2.0, metadata=reads())
    # an idle kernel sleeps on disk after this long (0: never; see .hibernation)
    kernel_hibernate_after_s: float = field(default=0.0, metadata=reads())
    # the most bytes a kernel's pickled state may take (a fork's, a hibernated kernel's)
    fork_state_bytes: int = field(default=FORK_STATE_BYTES, metadata=reads())

    @classmethod
    def from_settings(cls, settings: Settings) -> RestrictedConfig:
        """The restricted backend's part of the daemon's settings, as its fields say."""
        return from_settings(cls, settings)
