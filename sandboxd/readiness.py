"""Readiness: what ``GET /readyz`` reports, as one typed value (:class:`Readiness`), and the
cached confinement probes of the backends that feed it (:class:`BackendProbes`)."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from sandboxd.backends.base import Backend
from sandboxd.backends.factory import DEFAULT_BACKEND
from sandboxd.models import ProbeReport

#: how long probe reports are reused while no backend's availability changed
READINESS_CACHE_S = 10.0


class Readiness(BaseModel):
    """The daemon's readiness. ``ready``: the default backend proves its confinement, storage
    is writable, the workspace quota holds as configured, and the daemon is not draining.
    ``degraded`` names what is wrong without making it unready (a refused policy reload)."""

    ready: bool
    draining: bool = False
    backends: dict[str, dict[str, Any]] = Field(default_factory=dict)
    storage: dict[str, dict[str, Any]] = Field(default_factory=dict)
    workspace_quota: dict[str, Any] = Field(default_factory=dict)
    policy: dict[str, Any] = Field(default_factory=lambda: {"ok": True, "detail": None})
    degraded: list[str] = Field(default_factory=list)

    def default_backend_failure(self) -> str | None:
        """Why the default backend fails its self-test (None when it passes)."""
        default = self.backends.get(DEFAULT_BACKEND, {})
        if default.get("available") and default.get("ok"):
            return None
        failing = [f"{c['name']} ({c.get('detail', '')})"
                   for c in default.get("checks", []) if not c.get("ok")]
        return (f"failing probes: {'; '.join(failing)}" if failing else
                default.get("reason") or default.get("detail") or "backend unavailable")


class BackendProbes:
    """Each available backend's confinement probe, cached for :data:`READINESS_CACHE_S`
    while no backend's availability changed."""

    def __init__(self, backends: dict[str, Backend]) -> None:
        self.backends = backends
        self._cached: tuple[float, dict[str, bool], bool, dict[str, dict[str, Any]]] | None = None

    async def reports(self, fresh: bool = False) -> tuple[bool, dict[str, dict[str, Any]]]:
        """``(ready, {backend: report})``: ready when every available backend's probe
        passes and the default backend is available."""
        now = time.monotonic()
        available = {n: b.availability()[0] for n, b in self.backends.items()}
        if (not fresh and self._cached is not None and now - self._cached[0] < READINESS_CACHE_S
                and self._cached[1] == available):
            return self._cached[2], self._cached[3]
        reports: dict[str, dict[str, Any]] = {}
        ready = DEFAULT_BACKEND in self.backends
        for name, backend in self.backends.items():
            ok, why = backend.availability()
            if not ok:
                reports[name] = {"available": False, "reason": why, "ok": name != DEFAULT_BACKEND}
                ready = ready and name != DEFAULT_BACKEND
                continue
            try:
                report: ProbeReport = await backend.probe()
            except Exception as exc:
                report = ProbeReport(backend=name, ok=False, detail=f"probe crashed: {exc}")
            reports[name] = {"available": True, **report.model_dump()}
            ready = ready and report.ok
        self._cached = (now, available, ready, reports)
        return ready, reports


def policy_state(refused: tuple[str, list[str]] | None) -> dict[str, Any]:
    """The readiness view of the policy: ok, or the refused reload's problems (the previous
    policy stays in force, so this degrades readiness without failing it)."""
    if refused is None:
        return {"ok": True, "detail": None}
    since, problems = refused
    first = problems[0] if problems else "invalid policy"
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return {"ok": False, "since": since, "problems": problems,
            "detail": f"policy reload refused: {first}{more}; the previous policy stays in force"}
