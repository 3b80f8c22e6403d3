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
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, get_args

from .decode import check_choice as _choice
from .decode import check_int as _int
from .decode import check_list as _list
from .decode import check_obj as _obj
from .decode import check_text as _text
from .display import MAX_VALUE_REPR, DisplayCaps
from .limits import FORK_STATE_BYTES, Limits
from .plan import MAX_NAMES, Plan

#: what a request asks: python code, bash code (always in a bash kernel), a command plan,
#: the end of a container's kernel, or (``suspend``) that a container's runner wait for the
#: next daemon with ``resume_key``
CallKind = Literal["python", "bash", "plan", "kernel_stop", "suspend"]
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


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} must be true or false")
    return value


def _opt(value: Any, what: str, check: Any, *args: Any) -> Any:
    return None if value is None else check(value, what, *args)


def _short(value: Any, what: str, most: int = MAX_REPORT_TEXT) -> str:
    if not isinstance(value, str) or len(value) > most:
        raise ValueError(f"{what} must be a string of at most {most} characters")
    return value


def _seconds(value: Any, what: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or not 0 <= value <= MAX_GRACE_S):
        raise ValueError(f"{what} must be a number of seconds from 0 to {MAX_GRACE_S:g}")
    return float(value)


# ---------------------------------------------------------------- the request


@dataclass(frozen=True)
class WorkerRequest:
    """What a sandbox runs for one call. Common to both sandboxes: ``id``, ``kind``, ``code``
    (python) or ``plan`` (a command plan, executed as it is), the imports a python call may
    use, the call's ``limits`` (each sandbox applies :meth:`Limits.rlimits` to every process
    of the call, and its output cap), the ``display`` caps and ``kernel`` (a session call: it
    runs in the session's kernel).

    The restricted worker's: ``workspace`` (the host path it confines itself to), ``uid``
    (the sandbox uid it drops to), ``cpu_seconds`` (its RLIMIT_CPU; a kernel's absolute
    soft limit), ``cpu_call`` (a kernel's allowance for this call), ``max_file_bytes``
    (RLIMIT_FSIZE), ``probe`` and the probe's expectations. The runner's: ``env`` and
    ``cwd`` of the call's processes, ``interrupt_grace_s`` (how long an interrupted kernel
    may take to come back)."""

    kind: CallKind
    id: str = ""
    limits: Limits = field(default_factory=Limits)
    display: DisplayCaps = field(default_factory=DisplayCaps)
    code: str = ""
    plan: Plan | None = None
    imports_allow: tuple[str, ...] = ()
    imports_deny: tuple[str, ...] = ()
    kernel: bool = False
    #: a session kernel's: pickle the namespace (at most ``state_bytes``) and run nothing
    snapshot: bool = False
    #: a fork's first call: this many bytes of its parent's pickled state follow the request
    #: (restored in the fresh kernel before the call); a snapshot: the most it may write
    state_bytes: int = 0
    # the restricted worker's
    workspace: str = ""
    uid: int | None = None
    cpu_seconds: int = 1
    cpu_call: int | None = None
    max_file_bytes: int = 1024 * 1024
    probe: ProbeKind | None = None
    outside_path: str = ""
    expect_unprivileged: bool = False
    expect_namespaces: bool = False
    no_namespaces_reason: str | None = None
    # the container runner's
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = "/workspace"
    interrupt_grace_s: float = 0.0
    resume_key: str = ""  # hex: the next daemon's one-time key (a ``suspend`` request)
    programs: tuple[str, ...] = ()  # a bash call: the only programs its kernel may execute
    stdin: bool = False  # a plan: its stdin is a pipe the daemon feeds (frames i, c), not /dev/null

    def __post_init__(self) -> None:
        for name in ("imports_allow", "imports_deny", "programs"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        _choice(self.kind, "kind", _KINDS)
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
        return cls(kind="suspend", resume_key=key.hex())

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready form (:meth:`from_wire` reads it back)."""
        out = {name: getattr(self, name) for name in _REQUEST_KEYS}
        out.update(limits=self.limits.to_wire(), display=self.display.wire(),
                   plan=None if self.plan is None else self.plan.to_wire(),
                   imports_allow=list(self.imports_allow), imports_deny=list(self.imports_deny),
                   env=dict(self.env), programs=list(self.programs))
        for name in ("programs", "snapshot", "state_bytes", "stdin"):
            # a bash call's, a restricted kernel's, a plan fed its stdin: a runner built
            # before them reads the rest
            if not out[name]:
                del out[name]
        return out

    @classmethod
    def from_wire(cls, data: Any) -> WorkerRequest:
        """The request in ``data``, every member checked and bounded (a missing one takes
        its default; ``kind`` is required): ``ValueError`` for anything else."""
        d = _obj(data, "request", _REQUEST_KEYS, ("kind",))
        v: dict[str, Any] = {"kind": _choice(d["kind"], "kind", _KINDS)}
        for name, value in d.items():
            if name != "kind":
                v[name] = _REQUEST_DECODERS[name](value, name)
        return cls(**v)


def _env(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or len(value) > MAX_ENV:
        raise ValueError(f"{what} must be an object of at most {MAX_ENV} entries")
    return {_text(k, f"{what} key"): _text(v, f"{what}[{k}]") for k, v in value.items()}


def _code(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_CODE:
        raise ValueError(f"{what} must be a string of at most {MAX_CODE} characters")
    return value


def _hex(value: Any, what: str, limit: int) -> str:
    if (not isinstance(value, str) or len(value) > limit
            or any(c not in "0123456789abcdef" for c in value)):
        raise ValueError(f"{what} must be lower-case hex of at most {limit} digits")
    return value


def _names(value: Any, what: str) -> tuple[str, ...]:
    return _list(value, what, MAX_NAMES, _text)


_REQUEST_DECODERS: dict[str, Any] = {
    "id": lambda v, w: _short(v, w, MAX_ID),
    "limits": lambda v, w: Limits.from_wire(v),
    "display": DisplayCaps.from_wire,
    "code": _code,
    "plan": lambda v, w: _opt(v, w, lambda p, _w: Plan.from_wire(p)),
    "imports_allow": _names,
    "imports_deny": _names,
    "kernel": _bool,
    "snapshot": _bool,
    "state_bytes": lambda v, w: _int(v, w, 0, FORK_STATE_BYTES),
    "workspace": _text,
    "uid": lambda v, w: _opt(v, w, _int, 0, MAX_UID),
    "cpu_seconds": lambda v, w: _int(v, w, 0, MAX_SECONDS),
    "cpu_call": lambda v, w: _opt(v, w, _int, 0, MAX_SECONDS),
    "max_file_bytes": lambda v, w: _int(v, w, 0, 2**50),
    "probe": lambda v, w: _opt(v, w, _choice, _PROBES),
    "outside_path": _text,
    "expect_unprivileged": _bool,
    "expect_namespaces": _bool,
    "no_namespaces_reason": lambda v, w: _opt(v, w, _short),
    "env": _env,
    "cwd": _text,
    "interrupt_grace_s": _seconds,
    "resume_key": lambda v, w: _hex(v, w, MAX_KEY_HEX),
    "programs": _names,
    "stdin": _bool,
}
_REQUEST_KEYS = tuple(f.name for f in fields(WorkerRequest))
assert set(_REQUEST_DECODERS) == set(_REQUEST_KEYS) - {"kind"}


# ---------------------------------------------------------------- the report


def _json_value(value: Any, what: str) -> Any:
    """``value`` if it is made of JSON types only (dict keys strings, finite floats), within
    :data:`MAX_VALUE_NODES` (walked without recursion)."""
    todo, seen = [value], 0
    while todo:
        item = todo.pop()
        seen += 1
        if seen > MAX_VALUE_NODES:
            raise ValueError(f"{what} has more than {MAX_VALUE_NODES} parts")
        if isinstance(item, dict):
            if not all(isinstance(k, str) for k in item):
                raise ValueError(f"{what} has a key that is not a string")
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError(f"{what} has a number that is not finite")
        elif item is not None and not isinstance(item, str | int | bool):
            raise ValueError(f"{what} has a {type(item).__name__}, not a JSON value")
    return value


def _probe(value: Any, what: str) -> dict[str, tuple[bool, str]]:
    if not isinstance(value, dict) or len(value) > MAX_PROBE_CHECKS:
        raise ValueError(f"{what} must be an object of at most {MAX_PROBE_CHECKS} checks")
    out = {}
    for name, check in value.items():
        _short(name, f"{what} key", MAX_PROBE_NAME)
        if (not isinstance(check, list | tuple) or len(check) != 2
                or not isinstance(check[0], bool)):
            raise ValueError(f"{what}[{name}] must be [true or false, detail]")
        out[name] = (check[0], _short(check[1], f"{what}[{name}] detail"))
    return out


def _reasons(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or len(value) > MAX_NAMES:
        raise ValueError(f"{what} must be an object of at most {MAX_NAMES} names")
    return {_short(k, f"{what} key", MAX_PROBE_NAME * 4): _short(v, f"{what}[{k}]")
            for k, v in value.items()}


@dataclass(frozen=True)
class WorkerReport:
    """How one call ended, as its sandbox reports it (both sandboxes; a member a sandbox does
    not report keeps its default, ``None`` where its absence means something).

    ``outcome``: the restricted worker's word on the call (the runner's calls say it with
    ``exit_code``/``signal`` and the flags); ``value`` (``has_value``), ``value_repr``,
    ``message`` (the exception line), ``truncated_stdout``; resources (``cpu_ms``,
    ``peak_memory_bytes``, ``wall_ms``, ``worker_us``); the limits the runner saw hit
    (``oom``, ``pids_limit``, ``output_limit``), ``group_gone`` (the call's process group
    is gone), ``error`` (why the call failed or was refused); a container kernel's state
    (``kernel_*``, ``not_idle``); a restricted probe's checks (``probe``)."""

    outcome: Outcome | None = None
    exit_code: int | None = None
    signal: int | None = None
    value: Any = None
    has_value: bool = False
    value_repr: str | None = None
    message: str | None = None
    error: str | None = None
    truncated_stdout: bool = False
    worker_us: int = 0
    cpu_ms: int = 0
    peak_memory_bytes: int = 0
    wall_ms: int = 0
    oom: bool = False
    pids_limit: bool = False
    output_limit: bool = False
    group_gone: bool | None = None  # None: nothing was started, nothing to prove gone
    kernel_calls: int | None = None  # None: the runner has no kernels (an old image)
    kernel_fresh: bool | None = None
    kernel_lost: bool = False
    kernel_stopped: bool = False
    kernel_interrupted: bool = False
    not_idle: str | None = None
    probe: dict[str, tuple[bool, str]] | None = None
    #: a kernel's snapshot: the names it left out, with why
    not_carried: dict[str, str] | None = None

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready form: every member that differs from its default."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value != f.default or (f.name == "value" and self.has_value):
                out[f.name] = ({k: list(c) for k, c in value.items()} if f.name == "probe"
                               else value)
        return out

    @classmethod
    def from_wire(cls, data: Any) -> WorkerReport:
        """The report in ``data`` (a decoded JSON object), every member checked and bounded;
        ``ValueError`` for anything else. A ``value`` member sets ``has_value``."""
        d = _obj(data, "report", _REPORT_KEYS, ())
        values = {name: _REPORT_DECODERS[name](value, f"the report's {name}")
                  for name, value in d.items()}
        if "value" in d and "has_value" not in d:
            values["has_value"] = True
        return cls(**values)

    def with_value(self, value: Any, value_repr: str | None = None) -> WorkerReport:
        """This report with the call's value (and its repr)."""
        return replace(self, value=value, has_value=True, value_repr=value_repr)


def _counter(value: Any, what: str) -> int:
    return _int(value, what, 0, MAX_COUNTER)


_REPORT_DECODERS: dict[str, Any] = {
    "outcome": lambda v, w: _opt(v, w, _choice, _OUTCOMES),
    "exit_code": lambda v, w: _opt(v, w, _int, -255, 255),
    "signal": lambda v, w: _opt(v, w, _int, 1, 127),
    "value": _json_value,
    "has_value": _bool,
    "value_repr": lambda v, w: _opt(v, w, _short, MAX_VALUE_REPR),
    "message": lambda v, w: _opt(v, w, _short),
    "error": lambda v, w: _opt(v, w, _short),
    "truncated_stdout": _bool,
    "worker_us": _counter,
    "cpu_ms": _counter,
    "peak_memory_bytes": _counter,
    "wall_ms": _counter,
    "oom": _bool,
    "pids_limit": _bool,
    "output_limit": _bool,
    "group_gone": lambda v, w: _opt(v, w, _bool),
    "kernel_calls": lambda v, w: _opt(v, w, _counter),
    "kernel_fresh": lambda v, w: _opt(v, w, _bool),
    "kernel_lost": _bool,
    "kernel_stopped": _bool,
    "kernel_interrupted": _bool,
    "not_idle": lambda v, w: _opt(v, w, _short),
    "probe": lambda v, w: _opt(v, w, _probe),
    "not_carried": lambda v, w: _opt(v, w, _reasons),
}
_REPORT_KEYS = tuple(f.name for f in fields(WorkerReport))
assert set(_REPORT_DECODERS) == set(_REPORT_KEYS)
#: the outcomes a restricted worker may report
OUTCOMES: frozenset[str] = frozenset(_OUTCOMES)
#: the outcomes after which a session kernel keeps running (any limit or failure ends it); here,
#: not in the worker, so that the daemon's kernel code does not import the worker's stack
KERNEL_SURVIVES: frozenset[str] = frozenset({"ok", "error"})
