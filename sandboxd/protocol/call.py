"""One call between the daemon and a sandbox: the :class:`WorkerRequest` it sends (what to
run, where, under which limits) and the :class:`WorkerReport` it gets back (how the call
ended). One definition for both sandboxes: the restricted worker (and its session kernel)
and the container runner decode the same request, and the daemon decodes both sandboxes'
reports (the restricted worker's ``r`` frame, the runner's ``x`` exit record) with the same
:meth:`WorkerReport.from_wire`.

A report is written inside the sandbox, i.e. by an attacker who has read this code:
:meth:`WorkerReport.from_wire` refuses an unknown member, a wrong type, a string, number,
list or value beyond its bound, with a ``ValueError`` naming it. :meth:`WorkerRequest.
from_wire` bounds what it decodes the same way (the sandbox trusts the daemon, but a bug in
one side must not become a half-applied call on the other).

Standard library only and free of sandboxd imports: the container image carries this package.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from .decode import (
    Choice,
    Codec,
    Flag,
    Hex,
    Int,
    MapOf,
    Nested,
    OrNone,
    Part,
    Record,
    Seconds,
    Text,
    member,
)
from .display import MAX_VALUE_REPR, DisplayCaps
from .limits import FORK_STATE_BYTES, Limits
from .plan import MAX_NAMES, NAMES, Plan, freeze_lists

#: what a request asks: python code, bash or javascript/typescript code (always in that
#: language's kernel), a command plan,
#: the end of a container's kernel, or (``suspend``) that a container's runner wait for the
#: next daemon with ``resume_key``
CallKind = Literal["python", "bash", "javascript", "typescript", "plan", "kernel_stop",
                   "suspend"]
#: a restricted worker's self-test (readiness) instead of code
ProbeKind = Literal["basic", "memory"]
#: how a restricted worker says its call ended (the runner leaves it out: its exit status says)
Outcome = Literal["ok", "error", "memory_limit", "output_limit", "cpu_limit", "setup_error"]
_KINDS, _PROBES, _OUTCOMES = get_args(CallKind), get_args(ProbeKind), get_args(Outcome)

MAX_ID = 128
MAX_CODE = 16 * 1024 * 1024  # characters of a call's code
MAX_ENV = 256
MAX_SECONDS = 2**31  # a CPU allowance, seconds
MAX_UID = 2**32 - 1
MAX_GRACE_S = 3600.0
MAX_KEY_HEX = 128  # digits of a resume key
MAX_REPORT_TEXT = 4096  # message, error, not_idle
MAX_COUNTER = 2**63 - 1
MAX_PROBE_CHECKS = 64
MAX_PROBE_NAME = 64
MAX_VALUE_NODES = 1_000_000  # containers and scalars of a report's value, together

_FLAG = Flag()
_REPORT_TEXT = OrNone(Text(MAX_REPORT_TEXT))
_CPU_SECONDS = Int(0, MAX_SECONDS)
_COUNTER = Int(0, MAX_COUNTER)


# ---------------------------------------------------------------- the request


@dataclass(frozen=True)
class RestrictedPart(Record):
    """The restricted worker's part of a request: ``workspace`` (the host path it confines
    itself to), ``uid`` (the sandbox uid it drops to), ``cpu_seconds`` (its RLIMIT_CPU; a
    kernel's absolute soft limit), ``cpu_call`` (a kernel's allowance for this call),
    ``max_file_bytes`` (RLIMIT_FSIZE), and a readiness ``probe`` with its expectations. The
    runner ignores it."""

    WIRE_NAME = "request"
    WIRE_MEMBER = "{name}"

    workspace: str = member(Text(), "")
    uid: int | None = member(OrNone(Int(0, MAX_UID)), None)
    cpu_seconds: int = member(_CPU_SECONDS, 1)
    cpu_call: int | None = member(OrNone(_CPU_SECONDS), None)
    max_file_bytes: int = member(Int(0, 2**50), 1024 * 1024)
    probe: ProbeKind | None = member(OrNone(Choice(_PROBES)), None)
    outside_path: str = member(Text(), "")
    expect_unprivileged: bool = member(_FLAG, False)
    expect_namespaces: bool = member(_FLAG, False)
    no_namespaces_reason: str | None = member(_REPORT_TEXT, None)


@dataclass(frozen=True)
class RunnerPart(Record):
    """The container runner's part of a request: ``env`` and ``cwd`` of the call's processes,
    ``interrupt_grace_s`` (how long an interrupted kernel may take to come back), a
    ``suspend``'s ``resume_key``, a bash call's ``programs``, a plan's ``stdin``. The
    restricted worker ignores it."""

    WIRE_NAME = "request"
    WIRE_MEMBER = "{name}"

    env: dict[str, str] = member(MapOf(Text(), Text(), MAX_ENV), factory=dict)
    cwd: str = member(Text(), "/workspace")
    interrupt_grace_s: float = member(Seconds(0, MAX_GRACE_S), 0.0)
    #: hex: the next daemon's one-time key (a ``suspend`` request)
    resume_key: str = member(Hex(MAX_KEY_HEX), "")
    #: a bash call: the only programs its kernel may execute
    programs: tuple[str, ...] = member(NAMES, (), omit_default=True)
    #: a plan: its stdin is a pipe the daemon feeds (frames i, c), not /dev/null
    stdin: bool = member(_FLAG, False, omit_default=True)

    def __post_init__(self) -> None:
        if isinstance(self.programs, list):
            object.__setattr__(self, "programs", tuple(self.programs))


@dataclass(frozen=True)
class WorkerRequest(Record):
    """What a sandbox runs for one call: the part common to both sandboxes, and each
    sandbox's own part (:class:`RestrictedPart`, :class:`RunnerPart`). Common: ``id``,
    ``kind``, ``code`` (python) or ``plan`` (a command plan, executed as it is), the imports
    a python call may use, the call's ``limits`` (each sandbox applies :meth:`Limits.rlimits`
    to every process of the call, and its output cap), the ``display`` caps, ``kernel`` (a
    session call: it runs in the session's kernel) and a kernel's ``snapshot``/
    ``state_bytes``.

    On the wire the parts' members sit among the common ones (one flat object, as before
    they were typed apart: a runner built before reads it); every member is sent but
    ``programs``, ``snapshot``, ``state_bytes``, ``woken`` and ``stdin`` at their defaults (a runner
    built before them reads the rest); a missing one takes its default."""

    WIRE_NAME = "request"
    WIRE_MEMBER = "{name}"

    kind: CallKind = member(Choice(_KINDS))
    id: str = member(Text(MAX_ID), "")
    limits: Limits = member(Nested[Limits](Limits), factory=Limits)
    display: DisplayCaps = member(Nested[DisplayCaps](DisplayCaps), factory=DisplayCaps)
    code: str = member(Text(MAX_CODE), "")
    plan: Plan | None = member(OrNone(Nested[Plan](Plan)), None)
    imports_allow: tuple[str, ...] = member(NAMES, ())
    imports_deny: tuple[str, ...] = member(NAMES, ())
    kernel: bool = member(_FLAG, False)
    #: a session kernel's: pickle the namespace (at most ``state_bytes``) and run nothing
    snapshot: bool = member(_FLAG, False, omit_default=True)
    #: a fork's first call: this many bytes of its parent's pickled state follow the request
    #: (restored in the fresh kernel before the call); a snapshot: the most it may write
    state_bytes: int = member(Int(0, FORK_STATE_BYTES), 0, omit_default=True)
    #: those bytes are the kernel's own state from before it was hibernated: the modules'
    #: state it carries (``random``'s generator, ``decimal``'s context) comes back too
    woken: bool = member(_FLAG, False, omit_default=True)
    restricted: RestrictedPart = member(Part[RestrictedPart](RestrictedPart),
                                        factory=RestrictedPart)
    runner: RunnerPart = member(Part[RunnerPart](RunnerPart), factory=RunnerPart)

    def __post_init__(self) -> None:
        freeze_lists(self, "imports_allow", "imports_deny")
        Choice(_KINDS).decode(self.kind, "kind")
        if self.kind == "plan" and self.plan is None:
            raise ValueError("a plan request needs its plan")

    @classmethod
    def stop_kernel(cls) -> WorkerRequest:
        """The runner's ``kernel_stop``: end the container's kernel, run nothing."""
        return cls(kind="kernel_stop")

    @classmethod
    def suspend(cls, key: bytes) -> WorkerRequest:
        """The runner's ``suspend``: the daemon stops and keeps the session; reconnect to
        the next one with ``key`` (so a restart keeps the session's kernel)."""
        return cls(kind="suspend", runner=RunnerPart(resume_key=key.hex()))


# ---------------------------------------------------------------- the report


def _json_parts(item: Any, what: str) -> Any:
    """The values inside one part of a JSON value (a dict's values, a list's items; none in
    a scalar), or ``ValueError`` when the part is not JSON (a key that is not a string, a
    number that is not finite, another type)."""
    if isinstance(item, dict):
        if not all(isinstance(k, str) for k in item):
            raise ValueError(f"{what} has a key that is not a string")
        return item.values()
    if isinstance(item, list):
        return item
    if isinstance(item, float) and not math.isfinite(item):
        raise ValueError(f"{what} has a number that is not finite")
    if not isinstance(item, str | int | float | None):  # bool is an int
        raise ValueError(f"{what} has a {type(item).__name__}, not a JSON value")
    return ()


class JsonValue(Codec[Any]):
    """A value made of JSON types only (dict keys strings, finite floats), within
    :data:`MAX_VALUE_NODES` (walked without recursion)."""

    def decode(self, value: Any, what: str) -> Any:
        todo, seen = [value], 0
        while todo:
            seen += 1
            if seen > MAX_VALUE_NODES:
                raise ValueError(f"{what} has more than {MAX_VALUE_NODES} parts")
            todo.extend(_json_parts(todo.pop(), what))
        return value


class ProbeCheck(Codec[tuple[bool, str]]):
    """One check of a restricted probe: ``[passed, detail]``."""

    def decode(self, value: Any, what: str) -> tuple[bool, str]:
        if not isinstance(value, list | tuple) or len(value) != 2 or not isinstance(
                value[0], bool):
            raise ValueError(f"{what} must be [true or false, detail]")
        return value[0], Text(MAX_REPORT_TEXT).decode(value[1], f"{what} detail")

    def encode(self, value: tuple[bool, str]) -> Any:
        return list(value)


@dataclass(frozen=True)
class WorkerReport(Record):
    """How one call ended, as its sandbox reports it (both sandboxes; a member a sandbox does
    not report keeps its default, ``None`` where its absence means something).

    ``outcome``: the restricted worker's word on the call (the runner's calls say it with
    ``exit_code``/``signal`` and the flags); ``value`` (``has_value``), ``value_repr``,
    ``message`` (the exception line), ``truncated_stdout``; resources (``cpu_ms``,
    ``peak_memory_bytes``, ``wall_ms``, ``worker_us``); the limits the runner saw hit
    (``oom``, ``pids_limit``, ``output_limit``), ``group_gone`` (the call's process group
    is gone), ``error`` (why the call failed or was refused); a container kernel's state
    (``kernel_*``, ``not_idle``); a restricted probe's checks (``probe``).

    On the wire: every member that differs from its default (and ``value`` when
    ``has_value``); a ``value`` member sets ``has_value``."""

    WIRE_NAME = "report"
    WIRE_MEMBER = "the report's {name}"

    outcome: Outcome | None = member(OrNone(Choice(_OUTCOMES)), None, omit_default=True)
    exit_code: int | None = member(OrNone(Int(-255, 255)), None, omit_default=True)
    signal: int | None = member(OrNone(Int(1, 127)), None, omit_default=True)
    value: Any = member(JsonValue(), None, omit_default=True)
    has_value: bool = member(_FLAG, False, omit_default=True)
    value_repr: str | None = member(OrNone(Text(MAX_VALUE_REPR)), None, omit_default=True)
    message: str | None = member(_REPORT_TEXT, None, omit_default=True)
    error: str | None = member(_REPORT_TEXT, None, omit_default=True)
    truncated_stdout: bool = member(_FLAG, False, omit_default=True)
    worker_us: int = member(_COUNTER, 0, omit_default=True)
    cpu_ms: int = member(_COUNTER, 0, omit_default=True)
    peak_memory_bytes: int = member(_COUNTER, 0, omit_default=True)
    wall_ms: int = member(_COUNTER, 0, omit_default=True)
    oom: bool = member(_FLAG, False, omit_default=True)
    pids_limit: bool = member(_FLAG, False, omit_default=True)
    output_limit: bool = member(_FLAG, False, omit_default=True)
    #: None: nothing was started, nothing to prove gone
    group_gone: bool | None = member(OrNone(_FLAG), None, omit_default=True)
    #: None: the runner has no kernels (an old image)
    kernel_calls: int | None = member(OrNone(_COUNTER), None, omit_default=True)
    kernel_fresh: bool | None = member(OrNone(_FLAG), None, omit_default=True)
    kernel_lost: bool = member(_FLAG, False, omit_default=True)
    kernel_stopped: bool = member(_FLAG, False, omit_default=True)
    kernel_interrupted: bool = member(_FLAG, False, omit_default=True)
    not_idle: str | None = member(_REPORT_TEXT, None, omit_default=True)
    probe: dict[str, tuple[bool, str]] | None = member(
        OrNone(MapOf(Text(MAX_PROBE_NAME), ProbeCheck(), MAX_PROBE_CHECKS, "checks")), None,
        omit_default=True)
    #: a kernel's first call could not restore the state it was given (a fork's parent's,
    #: or its own from before it was hibernated): it starts empty, the code did not run
    restore_failed: bool = member(_FLAG, False, omit_default=True)
    #: a kernel's snapshot: the names it left out, with why
    not_carried: dict[str, str] | None = member(
        OrNone(MapOf(Text(MAX_PROBE_NAME * 4), Text(MAX_REPORT_TEXT), MAX_NAMES, "names")),
        None, omit_default=True)

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready form: every member that differs from its default (a value reported
        as null is a value)."""
        out = super().to_wire()
        if self.has_value:
            out["value"] = self.value
        return out

    @classmethod
    def from_wire(cls, data: Any, what: str | None = None) -> WorkerReport:
        """The report in ``data`` (a decoded JSON object), every member checked and bounded;
        ``ValueError`` for anything else. A ``value`` member sets ``has_value``."""
        report = super().from_wire(data, what)
        if "value" in data and "has_value" not in data:
            return replace(report, has_value=True)
        if not report.has_value and report.value is not None:  # a value it says it has not
            return replace(report, value=None)
        return report

    def with_value(self, value: Any, value_repr: str | None = None) -> WorkerReport:
        """This report with the call's value (and its repr)."""
        return replace(self, value=value, has_value=True, value_repr=value_repr)


#: the outcomes a restricted worker may report
OUTCOMES: frozenset[str] = frozenset(_OUTCOMES)
#: the outcomes after which a session kernel keeps running (any limit or failure ends it); here,
#: not in the worker, so that the daemon's kernel code does not import the worker's stack
KERNEL_SURVIVES: frozenset[str] = frozenset({"ok", "error"})
