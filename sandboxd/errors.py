"""The one root of the daemon's errors: :class:`SandboxdError`, with a ``code`` per error.

Every error the daemon raises on purpose derives from it (service, scheduler, sessions,
registry validation, policy loading, audit, configuration, tokens, storage, backends). The
HTTP layer (:mod:`sandboxd.api.problems`) is a table from ``code`` to status, problem type
and title; an error whose code is not in that table is a 500 without internals. The client
side mirrors this (:mod:`sandboxd.client.errors`: one root, a status table).

Not here, on purpose: the two standalone modules the container runner shares
(:mod:`sandboxd.wire`'s ``ProtocolError``, :mod:`sandboxd.rules`' ``PathRefused``: they may
import nothing of sandboxd), and what user code sees inside a sandbox.
"""

from __future__ import annotations

from typing import Any, ClassVar


class SandboxdError(Exception):
    """Base of every sandboxd error. ``code``: a stable identifier (the problem table's key)."""

    code: ClassVar[str] = "internal"

    def problem_fields(self) -> dict[str, Any]:
        """Members the problem+json body carries besides type, title, status and detail."""
        return {}

    def problem_headers(self) -> dict[str, str]:
        """HTTP headers of the response (``Retry-After``)."""
        return {}
