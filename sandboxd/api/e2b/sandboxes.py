"""E2B sandboxes: each one is a sandboxd session of its client, plus what E2B says of it.

The session is the sandbox: its workspace, its kernel, its containers, its TTL and its end
(``kill``, expiry, revocation: :meth:`~sandboxd.sessions.kernels.SessionOps.end_session`, verified).
Beside it this module keeps E2B's own facts (template, metadata, start time, the extra code
contexts, the background commands), in memory and in ``<state_dir>/e2b/<id>.json`` so that a
daemon restart that keeps the session keeps them too. A record whose session has ended is
dropped the next time anyone looks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from sandboxd.api.e2b.commands import Background
from sandboxd.api.e2b.watch import Watcher
from sandboxd.api.problems import Problem
from sandboxd.backends.capabilities import pausable
from sandboxd.service import Sandboxd
from sandboxd.sessions.record import SessionNotFound

Kind = Literal["python", "shell"]
TRANSPORT = "e2b"  # the front door named in the audit records
#: E2B's home directory: the sandbox's workspace root (see :func:`workspace_path`)
HOME = "/home/user"


@dataclass
class E2bSandbox:
    """E2B's view of one sandboxd session."""

    id: str
    client: str
    template: str
    kind: Kind
    metadata: dict[str, str]
    envs: dict[str, str]
    started_at: float
    #: extra code contexts: context id (the id of the session that holds its kernel) -> cwd
    contexts: dict[str, str] = field(default_factory=dict)
    #: the language of each extra context that is not Python's (context id -> language)
    languages: dict[str, str] = field(default_factory=dict)
    #: the names a kernel's last cell set of its own (``<session>/<language>`` -> names)
    cell_envs: dict[str, list[str]] = field(default_factory=dict)
    background: dict[int, Background] = field(default_factory=dict, repr=False)
    #: ``files.watch_dir``'s watchers (id -> watcher): polled, so no thread ends with them
    watchers: dict[str, Watcher] = field(default_factory=dict, repr=False)

    def stored(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("background")
        data.pop("watchers")
        return data


def not_served(feature: str, why: str = "") -> Problem:
    """The answer to whatever of E2B's API sandboxd does not serve: 501 naming the feature
    (never a 404, which the SDKs report as "sandbox not found")."""
    detail = f"sandboxd does not serve E2B's {feature}" + (f": {why}" if why else "")
    return Problem(501, "e2b-not-served", "Not served by sandboxd", detail, feature=feature)


def workspace_path(path: str) -> str:
    """An E2B path as a path in the sandbox's workspace: ``/home/user/x`` and ``x`` are
    ``x`` (the workspace is E2B's home directory); any other absolute path is refused."""
    if path in (HOME, HOME + "/", "", "."):
        return "."
    if path.startswith(HOME + "/"):
        return path[len(HOME) + 1:]
    if path.startswith("/"):
        raise Problem(403, "path-refused", "Path refused",
                      f"'{path}' is outside the sandbox's workspace: sandboxd serves files "
                      f"under {HOME} (the session's workspace) only")
    return path


class Sandboxes:
    """The E2B sandboxes of one daemon."""

    def __init__(self, service: Sandboxd) -> None:
        self.service = service
        self._records: dict[str, E2bSandbox] = {}
        self._dir = Path(service.settings.state_dir) / "e2b"

    def kind_of(self, template: str) -> Kind:
        templates = self.service.settings.e2b_templates
        if template not in templates:
            raise Problem(400, "e2b-template", "Unknown template",
                          f"template '{template}' is not served here; the administrator's "
                          f"e2b_templates setting names {sorted(templates)}")
        return templates[template]

    async def create(self, client: str, template: str, timeout_s: float | None,
                     metadata: dict[str, str], envs: dict[str, str]) -> E2bSandbox:
        kind = self.kind_of(template)
        session = await self.service.create_session(client, timeout_s, transport=TRANSPORT)
        record = E2bSandbox(session.id, client, template, kind, dict(metadata), dict(envs),
                            time.time())
        self._records[record.id] = record
        await asyncio.to_thread(self._save, record)
        return record

    def get(self, client: str, sandbox_id: str) -> E2bSandbox:
        """The client's live sandbox, else :class:`SessionNotFound` (another client's too)."""
        self.service.sessions.get(sandbox_id, client)  # live, and the caller's
        record = self._records.get(sandbox_id) or self._load(sandbox_id)
        if record is None or record.client != client:
            raise SessionNotFound(f"sandbox '{sandbox_id}' was not created through E2B's "
                                  "API or has ended")
        return record

    def owned(self, client: str) -> list[E2bSandbox]:
        live = {s.id for s in self.service.sessions.owned(client)}
        self._prune()
        return [r for r in self._records.values() if r.client == client and r.id in live]

    def expires_at(self, record: E2bSandbox) -> float:
        return self.service.sessions.get(record.id, record.client).expires_at

    async def set_timeout(self, record: E2bSandbox, timeout_s: float) -> None:
        for sid in (record.id, *record.contexts):
            with contextlib.suppress(SessionNotFound):
                self.service.sessions.retime(self.service.sessions.get(sid, record.client),
                                             timeout_s)

    def paused(self, record: E2bSandbox) -> bool:
        """Whether the sandbox's container is paused now (by E2B's pause, or idle)."""
        return record.id in {sid for backend in self.service.backends.values()
                             if (sandbox := pausable(backend)) is not None
                             for sid in sandbox.paused_sessions()}

    async def pause(self, record: E2bSandbox) -> None:
        """E2B's pause: the session's container (and its contexts') paused now, by the
        container backend's idle pause, audited (``session_paused``); else a 422 that says
        why nothing could be."""
        view = await self.service.pause_session(record.client, record.id, transport=TRANSPORT)
        for sid in record.contexts:
            with contextlib.suppress(SessionNotFound):
                await self.service.pause_session(record.client, sid, transport=TRANSPORT)
        if not view["paused_on"]:
            raise Problem(422, "e2b-pause-refused", "Nothing to pause", self._why_not(record))

    async def resume(self, record: E2bSandbox) -> None:
        """E2B's resume (or a connect to a paused sandbox): its containers thawed, audited
        (``session_resumed``); the kernels' state is as the pause left it."""
        for sid in (record.id, *record.contexts):
            with contextlib.suppress(SessionNotFound):
                await self.service.resume_session(record.client, sid, transport=TRANSPORT)

    def _why_not(self, record: E2bSandbox) -> str:
        tool = "python" if record.kind == "python" else "shell"
        backends = {s.backend for s in self.service.tools(record.client) if s.name == tool}
        backend = next(iter(backends), None)
        if backend is not None and backend != "container":
            return (f"sandbox '{record.id}' runs its calls on the {backend} backend, which "
                    "has no container to pause (its kernel is a confined worker process, "
                    "blocked between calls, that sandboxd does not freeze): pause serves "
                    "sandboxes whose tools run on the container backend")
        return (f"sandbox '{record.id}' has no container to pause now: none was started yet "
                "(its first call starts one), or a call is running in it (pause it once "
                "the call has ended)")

    async def kill(self, record: E2bSandbox) -> None:
        """End the sandbox: its background commands, its contexts' sessions, its session."""
        for job in list(record.background.values()):
            await job.stop()
        for sid in list(record.contexts):
            with contextlib.suppress(SessionNotFound):
                await self.service.delete_session(record.client, sid, transport=TRANSPORT)
        await self.service.delete_session(record.client, record.id, transport=TRANSPORT)
        self._forget(record.id)

    def save(self, record: E2bSandbox) -> None:
        self._save(record)

    # ------------------------------------------------------------ storage

    def _prune(self) -> None:
        live = {s.id for s in self.service.sessions.registered()}
        for sid, record in list(self._records.items()):
            if sid not in live:
                for job in record.background.values():
                    job.abandon()
                self._forget(sid)

    def _forget(self, sid: str) -> None:
        self._records.pop(sid, None)
        with contextlib.suppress(OSError):
            (self._dir / f"{sid}.json").unlink()

    def _save(self, record: E2bSandbox) -> None:
        self._dir.mkdir(mode=0o700, exist_ok=True)
        tmp = self._dir / f"{record.id}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(record.stored(), fh)
        os.replace(tmp, self._dir / f"{record.id}.json")

    def _load(self, sandbox_id: str) -> E2bSandbox | None:
        """A record a previous daemon wrote for a session this one kept."""
        if "/" in sandbox_id or sandbox_id.startswith("."):
            return None
        try:
            data = json.loads((self._dir / f"{sandbox_id}.json").read_text())
            record = E2bSandbox(**data)
        except (OSError, ValueError, TypeError):
            return None
        self._records[record.id] = record
        return record
