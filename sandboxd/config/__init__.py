"""Daemon settings: defaults < optional YAML config file < ``SANDBOXD_*`` environment < CLI flags.

The YAML file is ``/etc/sandboxd/sandboxd.yaml`` when it exists, or the file named by
``SANDBOXD_CONFIG`` / ``--config``. Keys are the field names below. Reading that file and
saying where a setting is wrong (file, line and column) is :mod:`sandboxd.config.files`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from sandboxd.config.files import DEFAULT_CONFIG_FILE as DEFAULT_CONFIG_FILE
from sandboxd.config.files import ConfigFileError as ConfigFileError
from sandboxd.config.files import YamlFileSource, config_file_named
from sandboxd.config.files import settings_problems as settings_problems
from sandboxd.protocol.limits import FORK_STATE_BYTES

#: a node id: lowercase letters, digits and inner hyphens, at most 32 characters (it is part of
#: every session id, and a proxy routes by it: sandboxd.fleet)
NODE_ID_PATTERN = r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$"


def default_node_id() -> str:
    """This host's short name as a node id: lower case, ``[a-z0-9-]``, at most 32 characters
    (``node`` when nothing of the name is left)."""
    import re
    import socket

    name = socket.gethostname().split(".", 1)[0].lower()
    name = re.sub(r"[^a-z0-9-]+", "-", name)[:32].strip("-")
    return name or "node"


def _default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/sandboxd")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sandboxd"


#: E2B's templates and what each runs with (the setting ``e2b_templates``'s default): the
#: code interpreter's (its SDK's default, ``code-interpreter-v1``) a python session, the base
#: template's commands and files only
E2B_TEMPLATES: dict[str, Literal["python", "shell"]] = {
    "code-interpreter-v1": "python", "code-interpreter": "python", "base": "shell"}


class Settings(BaseSettings):
    """Every setting of the daemon. Environment variables are ``SANDBOXD_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="SANDBOXD_", extra="forbid")
    _derived: set[str] = PrivateAttr(default_factory=set)

    # --- listening
    host: str = "127.0.0.1"
    port: int = 8765
    uds: Path | None = Field(default=None, description="Listen on this unix socket instead of TCP")
    uds_mode: int = Field(default=0o660, description="Mode of the unix socket file")
    uds_group: str | None = Field(default=None, description="Group of the unix socket file")

    # --- files
    state_dir: Path = Field(default_factory=_default_state_dir)
    policies_dir: Path | None = Field(
        default=None, description="Directory of policy YAML files (None: the embedded default)"
    )
    audit_log: Path | None = Field(default=None, description="None: <state_dir>/audit.jsonl")
    audit_max_bytes: int = Field(default=64 * 1024 * 1024, description="Rotate past this size")
    audit_retention_files: int | None = Field(
        default=None, ge=0,
        description="Keep at most this many rotated audit files (None: keep every one)")
    audit_retention_days: float | None = Field(
        default=None, gt=0,
        description="Delete rotated audit files older than this many days (None: never)")
    audit_head_interval_s: float = Field(
        default=60.0, gt=0,
        description="Sign the audit log's head this often while it changes (and at stop)")
    tokens_file: Path | None = Field(
        default=None, description="Token hashes -> clients; None: loopback only, client 'local'"
    )

    # --- scheduler
    max_concurrency: int = Field(default=4, ge=1)
    # a queued call holds a coroutine and its request: a burst of a few hundred (an evaluation
    # harness opening its sandboxes at once) waits its turn rather than getting 429s
    queue_size: int = Field(default=256, ge=0)
    queue_timeout_s: float = Field(default=30.0, gt=0, description="Longest wait for a slot")
    queue_per_client: int | None = Field(
        default=None, ge=1,
        description="Queue places one client may hold (None: half the queue, at least 1)")
    # raw file transfers (PUT/GET /v1/sessions/{id}/files/...) wait on the network, never on an
    # execution slot: each client has a small pool of transfer slots of its own
    transfer_slots_per_client: int = Field(
        default=4, ge=1,
        description="Raw file transfers one client may run at once (more wait, as calls do)")
    transfer_min_rate_bytes_s: int = Field(
        default=64 * 1024, ge=0,
        description="An upload slower than this on average after transfer_rate_grace_s ends "
                    "with 408 and leaves nothing; 0 = only the write_file time limit")
    transfer_rate_grace_s: float = Field(
        default=5.0, ge=0, description="Seconds an upload may take before its rate counts")

    # --- HTTP
    max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    rate_limit_per_minute: int = Field(default=600, ge=0, description="Per client; 0 = off")
    open_endpoints: list[Literal["metrics", "readyz", "docs"]] = Field(
        default_factory=list,
        description="With tokens: endpoints served without a token (docs = /docs, /redoc, "
                    "/openapi.json); /healthz is always open")
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Web origins (scheme://host[:port]) whose browser requests are served; "
                    "none by default: a request with an Origin header gets 403")
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Without tokens: Host names served besides localhost, 127.0.0.1 and ::1 "
                    "(DNS rebinding protection); with tokens any Host is served")
    auth_failure_limit: int = Field(
        default=20, ge=0,
        description="Failed authentications per peer per auth_failure_window_s before 429; 0 = off")
    auth_failure_window_s: float = Field(default=60.0, gt=0)
    auth_failure_audit_interval_s: float = Field(
        default=60.0, gt=0,
        description="Failed authentications are audited as one record per peer per interval")
    header_timeout_s: float = Field(
        default=5.0, gt=0, description="Close connections whose request headers take longer")
    max_connections: int | None = Field(
        default=None, ge=1,
        description="Open client connections at most (None: half of RLIMIT_NOFILE)")
    max_connections_per_peer: int | None = Field(
        default=None, ge=1,
        description="Open connections per peer address (None: a quarter of max_connections)")
    drain_grace_s: float = Field(default=30.0, ge=0, description="SIGTERM: in-flight grace")
    shutdown_timeout_s: float = Field(
        default=10.0, gt=0,
        description="A stop's bound after the drain's grace: cancelled calls' cleanup, answers "
                    "still going out, keeping sessions (their runners suspended at once); what "
                    "does not finish by then is cut and reported (keep drain_grace_s plus this "
                    "under the unit's TimeoutStopSec=45s)")
    response_write_timeout_s: float = Field(
        default=30.0, gt=0,
        description="Close a connection whose client reads none of its answer for this long "
                    "(the send buffer stays full): it holds no call, task or stop")
    request_body_timeout_s: float = Field(
        default=30.0, gt=0,
        description="Close a connection whose request body sends nothing for this long")

    # --- sessions
    session_ttl_s: float = Field(default=3600.0, gt=0)
    session_quota_bytes: int = Field(
        default=100 * 1024 * 1024, gt=0,
        description="Bytes a workspace may hold (a session's, and a one-shot call's)")
    session_quota_entries: int = Field(
        default=65536, ge=16,
        description="Files and directories (inodes) a workspace may hold")
    workspace_quota: Literal["auto", "kernel", "advisory"] = Field(
        default="auto",
        description="auto: a size/inode-limited tmpfs per workspace when the daemon may mount "
                    "(CAP_SYS_ADMIN), else advisory; kernel: required (not ready without it); "
                    "advisory: never mount, check before and after calls only")
    # --- restarts keep sessions (an upgrade or a config change must not end users' work)
    sessions_survive_restart: bool = Field(
        default=True,
        description="A clean stop (SIGTERM) keeps every session for the next start: tmpfs "
                    "workspaces stay mounted, session containers keep running with their "
                    "kernels; false: a stop ends every tmpfs-backed session (and its container)")
    adopt_timeout_s: float = Field(
        default=15.0, gt=0,
        description="At start, the re-adoption of every kept session container in all (tried "
                    "at once, while the daemon serves): a runner that has not reconnected by "
                    "then loses its kernel; a call of a session being adopted waits for it")
    max_sessions_per_client: int = Field(default=16, ge=1)
    fork_state_bytes: int = Field(
        default=FORK_STATE_BYTES, ge=1, le=FORK_STATE_BYTES,
        description="The most bytes a session kernel's pickled Python state may take to be "
                    "carried to its forks (the daemon holds one copy per fork request until "
                    "each fork's first call); a larger state is not carried, and the answer "
                    "says so")
    mcp_max_sessions_per_client: int | None = Field(
        default=None, ge=1,
        description="Open MCP sessions one client may hold (None: max_sessions_per_client); "
                    "an initialize past it gets 429")
    mcp_max_sessions: int = Field(
        default=256, ge=1,
        description="Open MCP sessions of every client together; an initialize past it gets 429")
    mcp_session_idle_s: float = Field(
        default=300.0, gt=0,
        description="An MCP session that has not called a tool ends after this long without a "
                    "request (one that has: after session_ttl_s)")
    max_display_bytes: int = Field(
        default=2 * 1024 * 1024, ge=1024,
        description="One display item of a call (display(), a matplotlib figure) at most, as "
                    "JSON (images as base64); a bigger one is replaced by a note saying so")
    max_displays: int = Field(default=32, ge=1,
                              description="Display items of one call at most")
    max_kernels: int = Field(
        default=0, ge=0,
        description="Live session Python kernels on this host at most (every backend "
                    "together); a session python call that would start one more gets 429; "
                    "0: as many as the host's memory holds above memory_reserve_bytes at "
                    "kernel_memory_bytes each (sandboxd.capacity)")
    kernel_memory_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024 * 1024,
        description="What a new session kernel is counted to need: the derived max_kernels "
                    "and every kernel's admission by memory headroom use it")
    memory_reserve_bytes: int = Field(
        default=0, ge=0,
        description="Memory the host keeps free: a new session, or a call that would start a "
                    "kernel, while the measured headroom (MemAvailable, or the room under the "
                    "daemon's cgroup memory.max) is below it gets 503 host-full with "
                    "Retry-After; 0: the larger of 512 MiB and 5% of the host's memory")
    kernel_interrupt_grace_s: float = Field(
        default=2.0, ge=0, le=60,
        description="At a session call's wall-clock limit or on a cancel, its code first gets "
                    "a KeyboardInterrupt; a kernel back in its loop within this many seconds "
                    "keeps its variables, else it is killed (a runaway call need not cost the "
                    "session its state)")
    kernel_hibernate_after_s: float = Field(
        default=0.0, ge=0,
        description="A restricted session kernel that has run no call for this many seconds "
                    "is hibernated: its state is pickled inside its sandbox and written to "
                    "the state directory, the kernel ends, and the session's next python call "
                    "restores it in a fresh kernel, random's generator and decimal's context "
                    "included. A kernel whose state cannot be pickled whole stays in memory. "
                    "0: never")

    # --- sandbox identity (the unprivileged uid/gid code runs as when the daemon is root)
    sandbox_uid: int = 10001  # the image's user (images are built with it)
    sandbox_gid: int = 10001
    # every live sandbox (call, session, warm container) runs as its own uid (= gid) of this
    # range, never shared while in use (see sandboxd.host.uids)
    sandbox_uid_first: int = Field(default=10100, ge=1000)
    sandbox_uid_count: int = Field(
        default=0, ge=0,
        description="0: derived, a uid for each of max_kernels and 256 for one-shot calls and "
                    "warm containers (900 at least, 50000 at most)")

    # --- restricted backend
    restricted_enabled: bool = True
    cgroup_root: Path = Field(default=Path("/sys/fs/cgroup"))

    # --- container backend
    container_enabled: bool = True
    docker_url: str | None = Field(
        default=None, description="The Docker engine (unix://, tcp:// or https://); None: "
        "DOCKER_HOST, with DOCKER_TLS_VERIFY and DOCKER_CERT_PATH, or /var/run/docker.sock")
    instance: str | None = Field(
        default=None, description="Label value for our containers; None: derived from state_dir"
    )
    python_image: str = "sandboxd/python:latest"
    shell_image: str = "sandboxd/python:latest"
    build_images: str = Field(
        default="", pattern=r"^[a-z0-9]*(,[a-z0-9]+)*$",
        description="Profiles (`sandboxd images build --profile`, comma-separated: "
                    "'python,datascience') whose image the daemon builds at start when missing "
                    "or stale, offline, in the background, once: their tools answer 503 with "
                    "the build's progress until it is done (`make run` sets it); '': none")
    warm_pool_size: int = Field(default=2, ge=0)
    session_pool_size: int = Field(
        default=2, ge=0,
        description="Sessions made ahead with their container started (while some policy "
                    "runs python in containers of the default image, with no network): a "
                    "new session's first call does not wait for its container; 0: none")
    seccomp_profile: Path | None = Field(
        default=None, description="None: the shipped policies/seccomp.json"
    )
    # --- idle session containers (paused: an idle session holds no CPU and can be thawed)
    session_pause_after_s: float = Field(
        default=60.0, ge=0,
        description="A session container with no call for this many seconds is paused (the "
                    "engine's cgroup freezer; its memory stays charged to it) and thawed at "
                    "its next call; 0: never paused")

    # --- packages: the admin's directory of wheels that install_packages reads
    wheelhouse: Path | None = Field(
        default=None,
        description="Directory of wheels (.whl) that container sessions may install from "
                    "with install_packages (mounted read-only; the daemon never writes it); "
                    "None: the tool is refused")

    # --- egress: the proxy that a policy's egress: rules are enforced by (sandboxd/egress)
    egress_resolver: str | None = Field(
        default=None, pattern=r"^(\d{1,3}(\.\d{1,3}){3}|\[[0-9a-fA-F:]+\]):\d{1,5}$",
        description="IP:PORT of the DNS server the egress proxy asks for the addresses of "
                    "allowed names (A and AAAA over UDP); None: the host's resolver")
    egress_upstream_ca: Path | None = Field(
        default=None,
        description="PEM file of the roots the egress proxy verifies servers with where it "
                    "terminates TLS (hosts with secrets); None: the system's roots")

    # --- fleet: the node this daemon is; session and MCP session ids carry it so that HAProxy
    # routes each call to the node that holds its session
    node_id: str = Field(
        default_factory=default_node_id, pattern=NODE_ID_PATTERN,
        description="This node's id in a fleet (docs/fleet.md): [a-z0-9-], at most 32 "
                    "characters; default: the host name's first label, cleaned")

    # --- E2B's wire protocol (sandboxd.api.e2b, docs/e2b.md): the template an E2B SDK names ->
    # what the sandbox's code runs with (``python``: run_code is the python tool in the
    # sandbox's session; ``shell``: commands and files only)
    e2b_templates: dict[str, Literal["python", "shell"]] = Field(
        default_factory=lambda: dict(E2B_TEMPLATES),
        description="E2B template name -> 'python' (code interpreter: run_code runs the "
                    "python tool in the sandbox's session) or 'shell' (commands and files "
                    "only); a template not named here is refused")

    access_log: bool = Field(
        default=False,
        description="A line per HTTP request in the daemon's log (uvicorn's access log); the "
                    "audit log records every call either way")

    # --- start-up
    probe_call_timeout_s: float = Field(
        default=30.0, gt=0, le=600,
        description="The wall-clock limit of each call of the container backend's self-test "
                    "(start-up, /readyz, doctor): its memory-limit check and its facts call; "
                    "raise it where the engine is slow to create a container")
    allow_unconfined: bool = Field(
        default=False, description="Serve even when the default backend fails its self-test"
    )

    # --- backends registered by their own packages (a new backend needs no core change):
    # each one's settings section, checked against the model its registry entry names by
    # sandboxd.backends.registry.check_sections (the settings sit below the backends, so the
    # check is the loader's caller's: serve, the CLI, and every build of the backends); the
    # built-in backends keep their flat settings above
    backends: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Settings sections of backends that define their own: {name: {...}}")

    @model_validator(mode="after")
    def _uid_pool_fits(self) -> Settings:
        self._derive_capacity()
        need = self.max_concurrency + self.warm_pool_size * 2 + 1
        if self.sandbox_uid_count < need:
            raise ValueError(
                f"sandbox_uid_count ({self.sandbox_uid_count}) must be at least {need}: one uid "
                "per concurrent call and warm container, and room for sessions"
            )
        return self

    def _derive_capacity(self) -> None:
        """Fill in the caps left at 0 from the host's memory (sandboxd.config.derived);
        :attr:`derived` names them."""
        if not (self.max_kernels and self.sandbox_uid_count and self.memory_reserve_bytes):
            from sandboxd.config import derived as defaults
            from sandboxd.util.memory import read_memory

            memory = read_memory()
            if not self.memory_reserve_bytes:
                self.memory_reserve_bytes = defaults.reserve_bytes(0, memory)
                self._derived.add("memory_reserve_bytes")
            if not self.max_kernels:
                self.max_kernels = defaults.max_kernels(memory, self.memory_reserve_bytes,
                                                        self.kernel_memory_bytes)
                self._derived.add("max_kernels")
            if not self.sandbox_uid_count:
                need = self.max_concurrency + 2 * self.warm_pool_size + 1
                self.sandbox_uid_count = defaults.uid_count(self.max_kernels, need)
                self._derived.add("sandbox_uid_count")

    @property
    def derived(self) -> frozenset[str]:
        """The settings derived from the host's memory (left at 0 by the admin)."""
        return frozenset(self._derived)

    @field_validator("build_images", mode="after")
    @classmethod
    def _profiles(cls, value: str) -> str:
        from sandboxd.config.images import PROFILES

        unknown = [p for p in value.split(",") if p and p not in PROFILES]
        if unknown:
            raise ValueError(f"unknown image profile {unknown[0]!r} (known: "
                             f"{', '.join(PROFILES)})")
        return value

    @field_validator("state_dir", "policies_dir", "audit_log", "tokens_file", "uds", "wheelhouse",
                     mode="after")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        return value.expanduser().absolute() if value is not None else None

    @property
    def audit_path(self) -> Path:
        return self.audit_log or self.state_dir / "audit.jsonl"

    @property
    def workspaces_dir(self) -> Path:
        return self.state_dir / "workspaces"

    @property
    def instance_name(self) -> str:
        """A stable name for this daemon instance (labels, cgroup names)."""
        if self.instance:
            return self.instance
        import hashlib

        return hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:12]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config = os.environ.get("SANDBOXD_CONFIG")
        path = Path(config) if config else DEFAULT_CONFIG_FILE
        return (init_settings, env_settings, YamlFileSource(settings_cls, path))


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Settings from the config file (``config_file`` wins over ``SANDBOXD_CONFIG``), the
    environment, and explicit overrides (``None`` values are ignored)."""
    clean = {k: v for k, v in overrides.items() if v is not None}
    if config_file is None:
        return Settings(**clean)
    with config_file_named(config_file):
        if not config_file.exists():
            raise ConfigFileError(f"{config_file}: no such config file")
        return Settings(**clean)
