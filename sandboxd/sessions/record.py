"""A session as it is stored (``<state>/sessions/<id>.json``) and shown, and the errors of
sessions: the record the session manager (:mod:`sandboxd.sessions.manager`), the restarts and the
API
share."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from sandboxd.errors import SandboxdError
from sandboxd.workspaces.quota import Usage


class SessionError(SandboxdError):
    """Base class for session problems."""

    code = "session-error"


class SessionNotFound(SessionError):
    """No such session for this client (or it expired)."""

    code = "unknown-session"


class SessionEnded(SessionNotFound):
    """The call's session ended (deleted, expired, its client revoked) while the call waited:
    the service answers it ``killed`` (``cancelled``); nothing of it ran."""


class SessionLimitReached(SessionError):
    """The client already has the maximum number of sessions."""

    code = "too-many-sessions"


class SessionOverQuota(SessionError):
    """The session's workspace uses more than its quota."""

    code = "session-over-quota"


@dataclass
class Session:
    """A session as stored on disk and returned by the API."""

    id: str
    client: str
    created_at: float
    expires_at: float
    ttl_s: float
    quota_bytes: int
    workspace: str
    uid: int | None = None  # its sandbox identity (uid = gid); None when the daemon is not root
    quota_entries: int = 0  # 0: written by a daemon that had no entry quota
    node: str = ""  # the node it lives on (a fleet routes by it); "": stored before fleets
    # backends on which a daemon stop found a live kernel (the session survives a restart but
    # that kernel may not, and a caller must not lose state unawares): the next python call
    # there says ``kernel.lost`` (``daemon_restart``) unless that kernel is alive again
    kernels_at_stop: list[str] = field(default_factory=list)
    # backends on which it has a live kernel, written when one starts and cleared when it
    # ends or a stop notes it above: what a crash would lose (:mod:`sandboxd.sessions.restarts`)
    kernels_live: list[str] = field(default_factory=list)
    # backends whose kernel a crash ended: the next python call there says ``daemon_crash``
    kernels_at_crash: list[str] = field(default_factory=list)

    def public(self, usage: Usage | None, kernels: list[str] | None = None,
               paused: bool = False) -> dict[str, object]:
        """The session as ``GET /v1/sessions/{id}`` shows it. ``kernels``: the backends on
        which it has a live Python kernel now; ``paused``: its sandbox is paused, idle."""
        return {
            "id": self.id,
            "node": self.node,
            "client": self.client,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "ttl_s": self.ttl_s,
            "quota_bytes": self.quota_bytes,
            "quota_entries": self.quota_entries,
            "workspace_bytes": usage.bytes if usage else 0,
            "workspace_entries": usage.entries if usage else 0,
            "kernel": {"live": bool(kernels), "backends": list(kernels or [])},
            "paused": paused,
        }

    @classmethod
    def load(cls, text: str) -> Session:
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
