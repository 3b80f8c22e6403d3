"""Fork a session: ``POST /v1/sessions/{id}/fork`` makes ``count`` new sessions of the same
client, each with a copy of the parent's workspace, in a sandbox of its own (its own uid,
workspace and quota; its own cgroup and limits once its first call runs), counted against
the client's ``max_sessions_per_client`` before any await (:mod:`sandboxd.util.reservations`).

The live Python process is not copied: a confined kernel has given up the privileges (a new
uid, a new root, a new cgroup) that a copy of its process would need to become a sandbox of
its own, and a copy that kept its parent's uid and root would share them with it. Its state
is carried instead, as data, on the restricted backend: the parent's kernel pickles its names
inside its own sandbox, the daemon relays the opaque bytes, and each fork's first ``python``
call starts a fresh kernel (its own uid, cgroup and limits) that restores them inside its own
sandbox (:mod:`sandboxd.backends.restricted.carry`,
:mod:`sandboxd.backends.restricted.lang.carry`). The answer says what came
(``kernel.carried``, ``kernel.not_carried``) or why nothing did (``kernel.reason``: no live
kernel, a backend that cannot carry it, a state over ``fork_state_bytes``).
"""

from __future__ import annotations

from sandboxd.fork.ops import KERNEL_NOT_CARRIED, MAX_FORKS, fork_session

__all__ = ["KERNEL_NOT_CARRIED", "MAX_FORKS", "fork_session"]
