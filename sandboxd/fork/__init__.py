"""Fork a session: ``POST /v1/sessions/{id}/fork`` makes ``count`` new sessions of the same
client, each with a copy of the parent's workspace, in a sandbox of its own (its own uid,
workspace and quota; its own cgroup and limits once its first call runs), counted against
the client's ``max_sessions_per_client`` before any await (:mod:`sandboxd.util.reservations`).

The live Python state is not carried: a confined kernel has given up the privileges (a new
uid, a new root, a new cgroup) that a copy of its process would need to become a sandbox of
its own, and a copy that kept its parent's uid and root would share them with it. The answer
says so (``kernel.carried`` false, with the reason); a fork's first ``python`` call starts a
fresh kernel in the copied files.
"""

from __future__ import annotations

from sandboxd.fork.ops import KERNEL_NOT_CARRIED, MAX_FORKS, fork_session

__all__ = ["KERNEL_NOT_CARRIED", "MAX_FORKS", "fork_session"]
