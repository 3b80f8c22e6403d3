"""The limits of one call, defined once: each limit's name, unit, default, bounds, the key
admins write in policy files and how a sandbox applies it.

Every boundary derives from :data:`LIMITS`: the policy file keys (``memory`` and
``max_memory``) and their checks, the request fields (``limits.memory_bytes``), the
effective :class:`Limits` of a decision, a result and an audit record, what the restricted
worker and the container runner apply to each process of a call (:meth:`Limits.rlimits`) and
what crosses the wire to a sandbox (:meth:`Limits.to_wire` / :meth:`Limits.from_wire`, which
bounds what it decodes). Adding a limit is a field here; a limit a sandbox applies as an
rlimit names it in its :class:`LimitInfo` and needs nothing else in any sandbox.

Standard library only and free of sandboxd imports: the container image carries this package.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

#: how a limit is written in a policy file: ``60s``, ``256Mi``, ``1.5``, ``64``
Unit = Literal["seconds", "bytes", "cpus", "count"]

MIB = 1024 * 1024
#: the most bytes a session kernel's pickled state may take to be carried to its forks (the
#: kernel stops pickling past it; the daemon's reader and each fork's kernel refuse more):
#: the daemon holds one copy per fork request, relayed to each fork's first call
FORK_STATE_BYTES = 256 * MIB


@dataclass(frozen=True)
class LimitInfo:
    """What one limit is, besides its value."""

    policy: str  # its key in a policy's ``limits:`` block; its maximum is ``max_<policy>``
    unit: Unit
    minimum: float  # the smallest value accepted anywhere (policy, request, wire)
    maximum: float  # the largest value accepted anywhere (a sandbox cannot go beyond it)
    doc: str
    rlimit: str | None = None  # the RLIMIT_* set (soft = hard) in every process of a call
    #: a session kernel keeps its first call's value (it is the kernel process's own limit)
    kernel: bool = False

    @property
    def policy_max(self) -> str:
        """The policy key of this limit's maximum."""
        return f"max_{self.policy}"

    @property
    def whole(self) -> bool:
        """Whether this limit is a whole number (a size or a count, not seconds or CPUs)."""
        return self.unit in ("bytes", "count")

    def number(self, value: float) -> float:
        """``value`` as this limit's field holds it: ``int`` when :attr:`whole`."""
        return int(value) if self.whole else float(value)

    def bound_text(self, bound: float) -> str:
        """A bound as an error says it: ``1024`` for a size or count, ``0.001`` otherwise."""
        return format(self.number(bound), "d" if self.whole else "g")

    def bounds(self) -> dict[str, float]:
        """``{"minimum": ..., "maximum": ...}`` as JSON Schema says them (whole numbers for
        sizes and counts)."""
        return {"minimum": self.number(self.minimum), "maximum": self.number(self.maximum)}

    def check(self, name: str, value: Any) -> float:
        """``value`` if it is a number within this limit's bounds, else ``ValueError``."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{name} must be a number")
        if self.whole and not float(value).is_integer():
            raise ValueError(f"{name} must be a whole number")
        if not math.isfinite(value) or not self.minimum <= value <= self.maximum:
            raise ValueError(f"{name} must be between {self.bound_text(self.minimum)} and "
                             f"{self.bound_text(self.maximum)}")
        return value


def _limit(default: float, info: LimitInfo) -> Any:
    return field(default=default, metadata={"limit": info})


#: a command's standard input, fed while it runs (E2B's ``send_stdin``, each message within
#: the daemon's ``max_body_bytes``): at most this many bytes over the command's life, sent in
#: frames of at most ``wire.READ_BYTES``. The daemon refuses more; the runner never holds
#: more for a command that does not read (in its container's memory).
MAX_STDIN_BYTES = 4 * MIB


@dataclass(frozen=True)
class Limits:
    """The effective limits of one execution: min(request, tool, policy maximum)."""

    timeout_s: float = _limit(60.0, LimitInfo(
        "timeout", "seconds", 0.001, 7 * 24 * 3600.0, "wall-clock timeout, seconds"))
    memory_bytes: int = _limit(256 * MIB, LimitInfo(
        "memory", "bytes", 1, 2.0**50, "memory of the call's processes together, bytes",
        kernel=True))
    cpus: float = _limit(1.0, LimitInfo(
        "cpus", "cpus", 0.001, 1024.0, "CPUs (1.5 = 150%)", kernel=True))
    pids: int = _limit(64, LimitInfo(
        "pids", "count", 1, 2.0**22, "processes and threads", kernel=True))
    output_bytes: int = _limit(MIB, LimitInfo(
        "output", "bytes", 1, 2.0**40, "stdout and stderr together, bytes"))
    open_files: int = _limit(64, LimitInfo(
        "open_files", "count", 16, 1024, "open file descriptors of each process",
        rlimit="RLIMIT_NOFILE", kernel=True))
    network: bool = False  # granted by the policy's ``network``, not a limit one lowers

    def lowered_by(self, request: Mapping[str, float] | None) -> Limits:
        """These limits, lowered (never raised) by what a request asks for."""
        if not request:
            return self
        return replace(self, **{name: min(getattr(self, name), wanted)
                                for name, wanted in request.items() if name in LIMITS})

    def lowered_requests(self, request: Mapping[str, float] | None
                         ) -> dict[str, tuple[float, float]]:
        """The requested limits these (effective) limits do not grant in full:
        ``{field: (asked, granted)}``."""
        return {name: (asked, getattr(self, name)) for name, asked in (request or {}).items()
                if name in LIMITS and getattr(self, name) < asked}

    def kept_by_kernel(self, kernel: Limits) -> Limits:
        """These (a session call's) limits with the values a session kernel keeps from its
        first call, ``kernel`` (memory, CPU share, pids, its rlimits)."""
        return replace(self, **{name: getattr(kernel, name)
                                for name, info in LIMITS.items() if info.kernel})

    def rlimits(self) -> dict[str, int]:
        """``{"RLIMIT_NOFILE": 64, ...}``: what a sandbox sets in each process of the call."""
        return {info.rlimit: int(getattr(self, name))
                for name, info in LIMITS.items() if info.rlimit is not None}

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready form sent to a sandbox (and written in audit records)."""
        return asdict(self)

    @classmethod
    def from_wire(cls, data: Any, what: str = "limits") -> Limits:
        """The limits in ``data`` (:meth:`to_wire`'s form), every value checked against its
        bounds: ``ValueError`` for anything else (an unknown key, a missing one, a bool for
        a number, a value out of range)."""
        if not isinstance(data, dict) or set(data) != set(LIMITS) | {"network"}:
            raise ValueError(f"{what} must have exactly the keys {sorted(LIMITS)} and network")
        if not isinstance(data["network"], bool):
            raise ValueError("network must be true or false")
        values: dict[str, Any] = {name: info.number(info.check(name, data[name]))
                                  for name, info in LIMITS.items()}
        return cls(**values, network=data["network"])


#: every limit, by its field name, in declaration order
LIMITS: dict[str, LimitInfo] = {f.name: f.metadata["limit"] for f in fields(Limits)
                                if "limit" in f.metadata}
#: the RLIMIT_* names a sandbox may be asked to set (the runner refuses any other)
RLIMIT_NAMES: frozenset[str] = frozenset(i.rlimit for i in LIMITS.values() if i.rlimit)
