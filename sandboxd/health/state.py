"""The service's health: whether it may take work (the state directory's room, the audit
log), its readiness report, and the audit of policy loads (a mixin of
:class:`~sandboxd.service.Sandboxd`, which provides the attributes below)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sandboxd.audit import AuditLog
from sandboxd.config import Settings
from sandboxd.errors import StorageUnavailable
from sandboxd.health.metrics import Metrics
from sandboxd.health.readiness import BackendProbes, Readiness, policy_state
from sandboxd.host.storage import full_reason
from sandboxd.results.recorder import AuditRecorder
from sandboxd.sessions.manager import SessionManager
from sandboxd.util.timefmt import utc_iso

log = logging.getLogger("sandboxd.service")


class HealthOps:
    """Health checks and readiness of :class:`~sandboxd.service.Sandboxd`."""

    settings: Settings
    sessions: SessionManager
    audit: AuditLog
    recorder: AuditRecorder
    metrics: Metrics
    probes: BackendProbes
    draining: bool
    policy_listeners: list[Callable[[], None]]
    _opened: bool
    _policy_refused: tuple[str, list[str]] | None

    def audit_problem(self) -> str | None:
        """Why the audit log cannot be written now (None: it can)."""
        return self.recorder.problem()

    def _check_state_dir(self) -> None:
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
        policy = policy_state(self._policy_refused)
        images = {image: build for backend in self.probes.backends.values()
                  for image, build in backend.building().items()}
        degraded = [] if policy["ok"] else ["policy"]
        if any(b.get("state") not in ("built", "up to date") for b in images.values()):
            degraded.append("images")
        return Readiness(
            ready=probes_ok and all(v["ok"] for v in storage.values()) and quota.ok
            and not self.draining,
            draining=self.draining, backends=backends, storage=storage,
            workspace_quota={"mode": "kernel" if quota.kernel else "advisory",
                             "setting": quota.setting, "ok": quota.ok, "detail": quota.detail},
            policy=policy, degraded=degraded, images=images)

    def _storage_state(self) -> dict[str, dict[str, Any]]:
        audit = self.audit_problem()
        state = full_reason(self.settings.state_dir, "state directory")
        return {"audit_log": {"ok": audit is None, "detail": audit},
                "state_dir": {"ok": state is None, "detail": state}}

    # ------------------------------------------------------------ policy events

    def _policy_event(self, event: str, fields: dict[str, Any]) -> None:
        """Audit a policy load or refusal and count it (the store logs it, once)."""
        self.metrics.policy_reloads.labels(
            result="refused" if event == "policy_refused" else "ok").inc()
        if event == "policy_refused":
            now = utc_iso(timespec="seconds")
            self._policy_refused = (now, list(fields.get("errors", [])))
        else:
            self._policy_refused = None
        if self._opened:  # an offline service (policy questions only) has no audit log
            try:
                self.audit.write(event, **fields)
            except Exception as exc:
                log.error("could not audit %s: %s", event, exc)
        if event == "policy_loaded":
            for listener in list(self.policy_listeners):
                try:
                    listener()
                except Exception:
                    log.exception("a policy listener failed")
