"""The policies in force, with reload on demand (SIGHUP) and on file change (polling).

A reload that fails keeps the previous policies in force; both outcomes are reported through
``on_event`` ("policy_loaded" / "policy_refused"), which the service forwards to the audit log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandboxd.errors import UnknownTool
from sandboxd.models import Decision, Explanation, LimitsRequest, ToolSpec
from sandboxd.policy import egress_checks, engine, specs
from sandboxd.policy.loader import LoadedPolicy, PolicyError, PolicySet, load_set
from sandboxd.policy.site import CallSite
from sandboxd.tools import validate_arguments

log = logging.getLogger("sandboxd.policy")

EventSink = Callable[[str, dict[str, Any]], None]
EMBEDDED_SOURCE = "policies/default.yaml"


def embedded_policies_dir() -> Path:
    """The shipped ``policies/`` directory: ``sandboxd/_data/policies`` in a wheel, the
    repository's top-level ``policies/`` in an editable install."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_data" / "policies", package.parent / "policies"):
        if (candidate / "default.yaml").is_file():
            return candidate
    raise PolicyError([f"{package / '_data' / 'policies'}: the embedded default policy is "
                       "missing (broken installation)"])


def policy_files(policies_dir: Path) -> list[Path]:
    """The policy files of a directory: ``*.yaml`` and ``*.yml``, not hidden, not recursive."""
    try:
        entries = sorted(policies_dir.iterdir())
    except OSError as exc:
        raise PolicyError([f"{policies_dir}: cannot read policies directory: "
                           f"{exc.strerror or exc}"]) from exc
    return [p for p in entries if p.suffix in (".yaml", ".yml") and not p.name.startswith(".")
            and p.is_file()]


class PolicyStore:
    """Loads the policy set and answers: which tools may this client use, and may it do this?"""

    def __init__(self, policies_dir: Path | None, *, on_event: EventSink | None = None) -> None:
        self.policies_dir = policies_dir
        self._on_event = on_event
        self._set: PolicySet | None = None
        self._lock = threading.Lock()  # serialises reloads; readers use the current snapshot
        self.last_error: list[str] = []

    # ------------------------------------------------------------------ loading

    def _dir_files(self) -> list[Path]:
        """The policy files of the configured directory; none when it is missing or empty."""
        if self.policies_dir is None or not self.policies_dir.exists():
            return []
        return policy_files(self.policies_dir)

    def _files(self) -> list[tuple[Path, str]]:
        files = self._dir_files()
        directory = self.policies_dir  # not None when there are files
        if files and directory is not None:
            return [(p, str(directory / p.name)) for p in files]
        if self.policies_dir is not None:
            # A fresh install: the directory exists (or will) but holds no policy yet.
            log.warning("%s has no policy files (*.yaml, *.yml): the embedded default policy "
                        "(%s) is in force until one is added there", self.policies_dir,
                        EMBEDDED_SOURCE)
        return [(embedded_policies_dir() / "default.yaml", EMBEDDED_SOURCE)]

    def _emit(self, event: str, fields: dict[str, Any]) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(event, fields)
        except Exception:  # the sink (audit log) reports its own failures
            log.exception("policy event %s could not be recorded", event)

    def _load(self) -> PolicySet:
        files: list[tuple[Path, str]] = []
        try:
            files = self._files()
            new = load_set(files)
        except PolicyError as exc:
            self.last_error = exc.problems
            self._emit("policy_refused", {
                "directory": str(self.policies_dir) if self.policies_dir else "(embedded)",
                "files": [source for _, source in files],
                "errors": exc.problems[:50],
                "kept_previous": self._set is not None,
            })
            raise
        self._set = new
        self.last_error = []
        self._emit("policy_loaded", {
            "files": [{"source": p.source, "policy": p.name, "sha256": p.sha256,
                       "clients": list(p.spec.clients)} for p in new.policies],
        })
        return new

    def load(self) -> None:
        """Initial load; raises :class:`PolicyError` when the set is invalid."""
        with self._lock:
            self._load()

    def reload(self) -> bool:
        """Re-read the files. On error the previous policies stay in force; returns False."""
        with self._lock:
            try:
                self._load()
            except PolicyError as exc:
                kept = ("the previous policy stays in force" if self._set is not None
                        else "no policy is in force: every call is denied")
                log.error("policy reload refused, %s:\n%s", kept, "\n".join(exc.problems))
                return False
        log.info("policies reloaded")
        return True

    def _snapshot(self) -> tuple[Any, ...]:
        try:
            paths = self._dir_files() or [embedded_policies_dir() / "default.yaml"]
        except PolicyError as exc:
            return ("error", tuple(exc.problems))
        snap = []
        for p in paths:
            try:
                st = os.stat(p)
            except OSError:
                continue
            snap.append((p.name, st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(snap)

    async def watch(self, interval_s: float = 1.0) -> None:
        """Reload whenever a policy file is added, removed or changed (mtime, size, inode).
        Runs until cancelled."""
        last = self._snapshot()
        while True:
            await asyncio.sleep(interval_s)
            current = self._snapshot()
            if current == last:
                continue
            last = current
            try:
                await asyncio.to_thread(self.reload)
            except Exception:  # never let the watcher die
                log.exception("policy reload failed unexpectedly")

    # ------------------------------------------------------------------ queries

    @property
    def current(self) -> PolicySet:
        """The policy set in force (raises if :meth:`load` never succeeded)."""
        if self._set is None:
            raise PolicyError(["policies not loaded"])
        return self._set

    def policies(self) -> list[LoadedPolicy]:
        """The loaded policies (for ``policy explain`` and status pages)."""
        return list(self.current.policies)

    def clients(self) -> dict[str, str]:
        """Client name (``"*"`` for the fallback) -> name of the policy that applies."""
        out = {c: p.name for c, p in self.current.by_client.items()}
        if self.current.fallback is not None:
            out["*"] = self.current.fallback.name
        return out

    def policy_for(self, client: str) -> LoadedPolicy | None:
        """The policy that applies to ``client`` (None: no policy, everything is denied)."""
        return self.current.for_client(client)

    def locate(self, client: str, rule: str) -> str:
        """``file:line:column`` of a rule of ``client``'s policy (for explain output)."""
        pol = self.policy_for(client)
        return pol.locate(rule) if pol is not None else "(no policy)"

    def tools_for(self, client: str) -> list[ToolSpec]:
        """The tools this client's policy enables (built-ins and admin-defined), with
        ``backend`` set and ``available=True`` (the service decides availability)."""
        pol = self.policy_for(client)
        return specs.tool_specs(pol) if pol is not None else []

    def runs_python_on(self, backend: str, client: str | None = None) -> bool:
        """Whether ``client``'s ``python`` tool (None: some client's) runs on ``backend`` in
        a sandbox a ready session holds (:mod:`sandboxd.sessions.ready`): the backend's own
        image, no network, no egress rules."""
        if self._set is None:
            return False
        pols = [self.policy_for(client)] if client is not None else self.policies()
        for pol in pols:
            cfg = pol.spec.tools.python if pol is not None else None
            if (pol is not None and cfg is not None and cfg.enabled and cfg.backend == backend
                    and not cfg.image and specs.tool_network(pol, cfg) in (None, "none")
                    and egress_checks.effective(cfg, pol.spec) is None):
                return True
        return False

    def decide(self, client: str, tool: str, arguments: dict[str, Any],
               requested: LimitsRequest | None, site: CallSite | None = None) -> Decision:
        """The decision for one call; ``arguments`` are already schema-valid. ``site``: where
        it runs (a call's, not a question's: :mod:`sandboxd.policy.site`)."""
        return engine.decide(self.policy_for(client), client, tool, arguments, requested,
                             site)

    def spec(self, client: str, tool: str) -> ToolSpec:
        """The client's tool of that name (:class:`UnknownTool`, naming the tools it has,
        when it has none)."""
        specs_ = {s.name: s for s in self.tools_for(client)}
        if tool not in specs_:
            raise UnknownTool(tool, sorted(specs_))
        return specs_[tool]

    def explain(self, client: str, tool: str, arguments: dict[str, Any],
                limits: LimitsRequest | None, *, unknown_tool_denied: bool = False
                ) -> Explanation:
        """The decision for a call and where its rule is written, without running anything.
        A tool the client does not have raises :class:`UnknownTool`, or with
        ``unknown_tool_denied`` gets the policy's denial (which says why)."""
        try:
            spec = self.spec(client, tool)
        except UnknownTool:
            if not unknown_tool_denied:
                raise
        else:
            validate_arguments(tool, spec.parameters, arguments)
        decision = self.decide(client, tool, arguments, limits)
        return Explanation(client=client, decision=decision,
                           location=self.locate(client, decision.rule))
