"""Per-call rlimits: what a request's limits ask for (``WorkerRequest.limits.rlimits()``,
``{"RLIMIT_NOFILE": 64, ...}``, :meth:`sandboxd.protocol.limits.Limits.rlimits`), set (soft =
hard) in every process a call starts, before user code or exec: the python worker, the worker
that executes a command plan (each command inherits them), a session kernel when it starts (a
kernel keeps its first call's rlimits, like its memory and pids).

Checked whole before anything starts (after the request's own bounds,
:meth:`sandboxd.protocol.call.WorkerRequest.from_wire`): a name not in
:data:`sandboxd.protocol.limits.RLIMIT_NAMES`, a value that is not an integer, negative, or
above the runner's own hard limit refuses the call (nothing is applied in part).
"""

from __future__ import annotations

import resource
from collections.abc import Mapping

from sandboxd.protocol.limits import RLIMIT_NAMES

#: ``(resource, value)`` pairs, checked
Rlimits = tuple[tuple[int, int], ...]


def requested_rlimits(asked: Mapping[str, int],
                      allowed: frozenset[str] | None = None) -> Rlimits:
    """The rlimits a request's limits ask for (:meth:`~sandboxd.protocol.limits.Limits.
    rlimits`), every one checked (names against ``allowed``, by default
    :data:`RLIMIT_NAMES`; values against this process's own hard limits); ``ValueError`` (a
    message for the daemon) for anything a call may not set."""
    allowed = RLIMIT_NAMES if allowed is None else allowed
    if not isinstance(asked, Mapping):
        raise ValueError("rlimits must map RLIMIT_* names to integers")
    pairs = []
    for name, value in asked.items():
        if name not in allowed or not isinstance(getattr(resource, name, None), int):
            raise ValueError(f"rlimit {str(name)[:40]!r} is not one a call may set (allowed: "
                             f"{', '.join(sorted(allowed)) or 'none'})")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"rlimit {name} must be an integer")
        which = getattr(resource, name)
        hard = resource.getrlimit(which)[1]
        if value < 0 or (hard != resource.RLIM_INFINITY and value > hard):
            raise ValueError(f"rlimit {name} = {value} is outside 0 .. the runner's own hard "
                             f"limit ({'unlimited' if hard == resource.RLIM_INFINITY else hard})")
        pairs.append((which, value))
    return tuple(pairs)


def apply_rlimits(rlimits: Rlimits) -> None:
    """Set each rlimit, soft = hard, in this process (and so in what it starts)."""
    for which, value in rlimits:
        resource.setrlimit(which, (value, value))


def inherited_as_is(rlimits: Rlimits) -> bool:
    """True when this process already has every one of ``rlimits`` (soft = hard = value): a
    child started without a fork of its own (posix_spawn) then has them too."""
    return all(resource.getrlimit(which) == (value, value) for which, value in rlimits)
