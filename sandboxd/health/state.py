"""The service's health: whether it may take work (the state directory's room, the audit
log, draining), its readiness report, and the audit of policy loads. One :class:`Health`,
built by :class:`~sandboxd.service.Sandboxd` with what it reads."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sandboxd.backends.capabilities import image_builder
from sandboxd.config import Settings
from sandboxd.errors import StorageUnavailable
from sandboxd.health.metrics import Metrics
from sandboxd.health.readiness import BackendProbes, Readiness, policy_state
from sandboxd.host.storage import full_reason
from sandboxd.sessions.manager import SessionManager
from sandboxd.util.timefmt import utc_iso

log = logging.getLogger("sandboxd.service")


class Health:
    """Health checks and readiness of the service. ``audit_problem``: why the audit log
    cannot be written now (None: it can); ``write``: write one audit record now (a service
    without an audit log, for offline policy questions, writes nothing)."""

    def __init__(self, settings: Settings, sessions: SessionManager, metrics: Metrics,
                 probes: BackendProbes, *, audit_problem: Callable[[], str | None],
                 write: Callable[..., None]) -> None:
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics
        self.probes = probes
        self.audit_problem = audit_problem
        self.write = write
        #: refusing new calls (503) and not ready: the daemon is stopping
        self.draining = False
        #: called (in the event loop's thread) after every policy load that took effect: the
        #: MCP front door announces changed tool lists with it
        self.policy_listeners: list[Callable[[], None]] = []
        # (when, problems) of the last refused policy reload while it is the latest word
        self.policy_refused: tuple[str, list[str]] | None = None

    def check_state_dir(self) -> None:
        """Refuse work (507) before anything runs when the state directory is full."""
        why = full_reason(self.settings.state_dir, "state directory")
        if why is not None:
            self.metrics.rejections.labels(reason="storage_full").inc()
            raise StorageUnavailable(why)

    # ------------------------------------------------------------ readiness

    async def readiness(self, *, fresh: bool = False) -> Readiness:
        """Run each available backend's confinement probe (cached briefly); storage (audit
        log, state directory), the workspace quota, the policy and draining are read fresh."""
        storage = await asyncio.to_thread(self._storage_state)
        probes_ok, backends = await self.probes.reports(fresh)
        quota = self.sessions.fs  # read fresh too: its mount helper may have died
        policy = policy_state(self.policy_refused)
        images = self._images()
        return Readiness(
            ready=probes_ok and all(v["ok"] for v in storage.values()) and quota.ok
            and not self.draining,
            draining=self.draining, backends=backends, storage=storage,
            workspace_quota={"mode": "kernel" if quota.kernel else "advisory",
                             "setting": quota.setting, "ok": quota.ok, "detail": quota.detail},
            policy=policy, degraded=_degraded(policy, images), images=images)

    def _images(self) -> dict[str, dict[str, Any]]:
        """The images the backends are building for their tools (or failed to build)."""
        return {image: build for backend in self.probes.backends.values()
                if (builder := image_builder(backend)) is not None
                for image, build in builder.building().items()}

    def _storage_state(self) -> dict[str, dict[str, Any]]:
        audit = self.audit_problem()
        state = full_reason(self.settings.state_dir, "state directory")
        return {"audit_log": {"ok": audit is None, "detail": audit},
                "state_dir": {"ok": state is None, "detail": state}}

    # ------------------------------------------------------------ policy events

    def policy_event(self, event: str, fields: dict[str, Any]) -> None:
        """Audit a policy load or refusal and count it (the store logs it, once)."""
        self.metrics.policy_reloads.labels(
            result="refused" if event == "policy_refused" else "ok").inc()
        if event == "policy_refused":
            now = utc_iso(timespec="seconds")
            self.policy_refused = (now, list(fields.get("errors", [])))
        else:
            self.policy_refused = None
        try:
            self.write(event, **fields)
        except Exception as exc:
            log.error("could not audit %s: %s", event, exc)
        if event == "policy_loaded":
            self._tell_listeners()

    def _tell_listeners(self) -> None:
        """Call every policy listener (a failing one is logged, the others still called)."""
        for listener in list(self.policy_listeners):
            try:
                listener()
            except Exception:
                log.exception("a policy listener failed")


def _degraded(policy: dict[str, Any], images: dict[str, dict[str, Any]]) -> list[str]:
    """What is wrong without making the daemon unready: a refused policy reload, an image
    its tools need not built yet (or failed)."""
    degraded = [] if policy["ok"] else ["policy"]
    if any(b.get("state") not in ("built", "up to date") for b in images.values()):
        degraded.append("images")
    return degraded
