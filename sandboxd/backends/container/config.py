"""What the container backend needs from the daemon's settings, and nothing more."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxd.backends.settings import from_settings, reads

if TYPE_CHECKING:
    from sandboxd.config import Settings


@dataclass(frozen=True)
class ContainerConfig:
    """The container backend's own settings: each field names the daemon setting it is read
    from (:mod:`sandboxd.backends.settings`; its defaults serve a config built directly)."""

    state_dir: Path = field(metadata=reads())  # runner sockets live under <state_dir>/run
    # label of this daemon's containers (the start-up sweep finds them)
    instance_name: str = field(metadata=reads("instance", "state_dir",
                                              derive=lambda s: s.instance_name))
    python_image: str = field(metadata=reads())
    shell_image: str = field(metadata=reads())
    docker_url: str | None = field(default=None, metadata=reads())
    # None: the shipped profile
    seccomp_profile: Path | None = field(default=None, metadata=reads())
    # the identity code runs as without a uid pool
    sandbox_uid: int = field(default=10001, metadata=reads())
    sandbox_gid: int = field(default=10001, metadata=reads())
    # the uid pool's range, when the backend makes its own
    sandbox_uid_first: int = field(default=10100, metadata=reads())
    sandbox_uid_count: int = field(default=900, metadata=reads())
    # the workspace tmpfs of a one-shot call
    session_quota_bytes: int = field(default=100 * 1024 * 1024, metadata=reads())
    session_quota_entries: int = field(default=65536, metadata=reads())
    warm_pool_size: int = field(default=2, metadata=reads())
    # ready sessions whose container is started ahead (sandboxd.sessions.ready)
    session_pool_size: int = field(default=2, metadata=reads())
    # an interrupted session kernel may come back this long
    kernel_interrupt_grace_s: float = field(default=2.0, metadata=reads())
    # an idle session container is paused (0: never)
    session_pause_after_s: float = field(default=60.0, metadata=reads())
    # each self-test call's wall-clock limit
    probe_call_timeout_s: float = field(default=30.0, metadata=reads())
    # mounted read-only into session containers when set
    wheelhouse: Path | None = field(default=None, metadata=reads())
    # image profiles built at start when missing (.build)
    build_profiles: tuple[str, ...] = field(default=(), metadata=reads(
        "build_images", derive=lambda s: tuple(p for p in s.build_images.split(",") if p)))
    # a start's re-adoption of kept session containers, in all
    adopt_timeout_s: float = field(default=15.0, metadata=reads())
    # IP:PORT of the egress proxy's DNS server (None: the host's)
    egress_resolver: str | None = field(default=None, metadata=reads())
    # roots the proxy verifies servers with (None: the system's)
    egress_upstream_ca: Path | None = field(default=None, metadata=reads())

    @classmethod
    def from_settings(cls, settings: Settings) -> ContainerConfig:
        """The container backend's part of the daemon's settings, as its fields say."""
        return from_settings(cls, settings)
