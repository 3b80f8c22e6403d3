"""Readiness: what ``GET /readyz`` reports, as one typed value (:class:`Readiness`), and the
cached confinement probes of the backends that feed it (:class:`BackendProbes`)."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field

from sandboxd.backends.base import Backend
from sandboxd.backends.capabilities import self_healing
from sandboxd.backends.registry import default_backend
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
    #: the images the daemon is building (or failed to build) for its tools: their tools
    #: answer 503 until then; degraded says ``images`` meanwhile
    images: dict[str, dict[str, Any]] = Field(default_factory=dict)


def backend_failure(report: dict[str, Any]) -> str | None:
    """Why a backend's report (as in ``Readiness.backends``) fails (None when it passes)."""
    if report.get("available") and report.get("ok"):
        return None
    failing = [f"{c['name']} ({c.get('detail', '')})"
               for c in report.get("checks", []) if not c.get("ok")]
    return (f"failing probes: {'; '.join(failing)}" if failing else
            report.get("reason") or report.get("detail") or "backend unavailable")


class BackendProbes:
    """Each available backend's confinement probe, cached for :data:`READINESS_CACHE_S`
    while no backend's availability changed."""

    def __init__(self, backends: dict[str, Backend]) -> None:
        self.backends = backends
        self._cached: tuple[float, dict[str, bool], bool, dict[str, dict[str, Any]]] | None = None

    async def reports(self, fresh: bool = False) -> tuple[bool, dict[str, dict[str, Any]]]:
        """``(ready, {backend: report})``: ready when every available backend's probe
        passes, the default backend is available, and no backend is ``healing`` (rebuilding
        its own state that vanished under the daemon, e.g. the container runner directory)."""
        now = time.monotonic()
        if not fresh and (kept := self._kept(now)) is not None:
            return kept
        reports = {name: await self.report(name) for name in self.backends}
        # an unavailable backend other than the default is ok (its report says so), unless
        # it is healing
        ready = default_backend() in self.backends and all(r["ok"] for r in reports.values())
        # keyed on the availability the reports show (it may change while a probe runs)
        self._cached = (now, {n: bool(r["available"]) for n, r in reports.items()}, ready,
                        reports)
        return ready, reports

    def _kept(self, now: float) -> tuple[bool, dict[str, dict[str, Any]]] | None:
        """The cached answer while it is younger than :data:`READINESS_CACHE_S` and no
        backend's availability changed (else ``None``); an unavailable backend's reason is
        read fresh (an image build's progress)."""
        now_ok = {n: b.availability() for n, b in self.backends.items()}
        available = {n: ok for n, (ok, _why) in now_ok.items()}
        cached = self._cached
        if cached is None or now - cached[0] >= READINESS_CACHE_S or cached[1] != available:
            return None
        return cached[2], {n: r if r["available"] else {**r, "reason": now_ok[n][1]}
                           for n, r in cached[3].items()}

    async def report(self, name: str) -> dict[str, Any]:
        """One backend's report, probed now: ``available`` and, when it is, its probe. The
        start-up self-test asks only the default backend's (a container probe starts real
        containers; /readyz probes every backend)."""
        backend = self.backends[name]
        ok, why = backend.availability()
        if not ok:
            # optional by design (ready without it), unless it is rebuilding what of its own
            # vanished under the daemon (``healing``): then the daemon is damaged
            healer = self_healing(backend)
            fine = name != default_backend() and (healer is None or healer.healing is None)
            return {"available": False, "reason": why, "ok": fine}
        try:
            report: ProbeReport = await backend.probe()
        except Exception as exc:
            report = ProbeReport(backend=name, ok=False, detail=f"probe crashed: {exc}")
        return {"available": True, **report.model_dump()}


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
