"""What the container backend needs from the daemon's settings, and nothing more."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandboxd.config import Settings


@dataclass(frozen=True)
class ContainerConfig:
    """The container backend's own settings (built from the daemon's by :meth:`from_settings`)."""

    state_dir: Path  # runner sockets live under <state_dir>/run
    instance_name: str  # label of this daemon's containers (the start-up sweep finds them)
    python_image: str
    shell_image: str
    docker_url: str | None = None
    seccomp_profile: Path | None = None  # None: the shipped profile
    sandbox_uid: int = 10001  # the identity code runs as without a uid pool
    sandbox_gid: int = 10001
    sandbox_uid_first: int = 10100  # the uid pool's range, when the backend makes its own
    sandbox_uid_count: int = 900
    session_quota_bytes: int = 256 * 1024 * 1024  # the workspace tmpfs of a one-shot call
    session_quota_entries: int = 65536
    warm_pool_size: int = 2
    kernel_interrupt_grace_s: float = 2.0  # an interrupted session kernel may come back this long
    session_pause_after_s: float = 60.0  # an idle session container is paused (0: never)
    probe_call_timeout_s: float = 30.0  # each self-test call's wall-clock limit
    wheelhouse: Path | None = None  # mounted read-only into session containers when set
    build_profiles: tuple[str, ...] = ()  # image profiles built at start when missing (.build)
    adopt_timeout_s: float = 15.0  # a start's re-adoption of kept session containers, in all
    egress_resolver: str | None = None  # IP:PORT of the egress proxy's DNS server (None: host)
    egress_upstream_ca: Path | None = None  # roots the proxy verifies servers with (None: system)

    @classmethod
    def from_settings(cls, settings: Settings) -> ContainerConfig:
        """The container backend's part of the daemon's settings."""
        return cls(
            state_dir=settings.state_dir, instance_name=settings.instance_name,
            python_image=settings.python_image, shell_image=settings.shell_image,
            docker_url=settings.docker_url, seccomp_profile=settings.seccomp_profile,
            sandbox_uid=settings.sandbox_uid, sandbox_gid=settings.sandbox_gid,
            sandbox_uid_first=settings.sandbox_uid_first,
            sandbox_uid_count=settings.sandbox_uid_count,
            session_quota_bytes=settings.session_quota_bytes,
            session_quota_entries=settings.session_quota_entries,
            warm_pool_size=settings.warm_pool_size,
            kernel_interrupt_grace_s=settings.kernel_interrupt_grace_s,
            session_pause_after_s=settings.session_pause_after_s,
            probe_call_timeout_s=settings.probe_call_timeout_s,
            wheelhouse=settings.wheelhouse,
            build_profiles=tuple(p for p in settings.build_images.split(",") if p),
            adopt_timeout_s=settings.adopt_timeout_s,
            egress_resolver=settings.egress_resolver,
            egress_upstream_ca=settings.egress_upstream_ca,
        )
