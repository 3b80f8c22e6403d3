"""What one call runs, as the policy decided it: the :class:`ExecutionPlan` every layer after
the policy passes on (the service, the backends, the audit log, ``policy explain``), and the
command :class:`Plan` of a command tool (pipelines of :class:`PlannedCommand` with their
:class:`Redirect`), which the sandboxes execute as it is: a command line never reaches a shell.

Frozen dataclasses, standard library only: :meth:`to_wire` gives the JSON-ready form (a command
plan's is the very form the container runner reads as ``req["plan"]``), :meth:`from_wire`
decodes it with every list, string and number bounded (``ValueError`` for anything else).

A python call's code is not part of the plan: it is the caller's argument (audited as such,
up to a megabyte), while the plan is what the policy made of it - which imports it may use,
where and under which limits it runs.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, cast, get_args

from .decode import MAX_TEXT as MAX_TEXT
from .decode import check_choice as _choice
from .decode import check_int as _int
from .decode import check_list as _list
from .decode import check_obj as _obj
from .decode import check_opt_text as _opt_text
from .decode import check_text as _text
from .display import DisplayCaps
from .limits import Limits

#: what a :class:`Redirect` does with its descriptor
RedirectMode = Literal["read", "write", "append", "readwrite", "dup", "close"]
#: when a :class:`Pipeline` runs, after the one before it
RunIf = Literal["always", "ok", "failed"]

#: bounds of what :meth:`Plan.from_wire` / :meth:`ExecutionPlan.from_wire` accept
MAX_WORDS = 65536  # words of one argv
MAX_PIPELINES = 4096
MAX_COMMANDS = 4096  # commands of one pipeline
MAX_REDIRECTS = 64  # redirects of one command
MAX_ENV = 256  # variables a planned command adds
MAX_NAMES = 4096  # entries of exec_only, imports_allow, imports_deny
MAX_FD = 9
MAX_FILE_BYTES = 2**50  # the largest file cap


class ToolKind(StrEnum):
    """What a backend is asked to do."""

    python = "python"  # run arguments["code"]
    bash = "bash"  # run arguments["code"] in a bash kernel (ExecutionPlan.programs)
    command = "command"  # run ExecutionPlan.command
    read_file = "read_file"
    write_file = "write_file"
    list_files = "list_files"


#: the kinds whose session calls run in a session kernel (state kept between calls)
KERNEL_KINDS = frozenset({ToolKind.python, ToolKind.bash})


# ---------------------------------------------------------------- bounded decoding

def _freeze(obj: object, *names: str) -> None:
    """Turn the list fields ``names`` of a frozen dataclass into tuples (deeply immutable)."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, list):
            object.__setattr__(obj, name, tuple(value))


# ---------------------------------------------------------------- the command plan


@dataclass(frozen=True)
class Redirect:
    """One redirect of a planned command, in the order written: descriptor ``fd`` is opened
    on the workspace file ``path`` (``read`` ``<``, ``write`` ``>``/``>|``, ``append`` ``>>``,
    ``readwrite`` ``<>``), made a copy of descriptor ``dup`` (``>&``/``<&``), or closed
    (``>&-``). ``path`` is workspace-relative (normalised like every file-tool path) or
    ``/dev/null``; the runner opens it inside the workspace, never through a symlink."""

    fd: int
    mode: RedirectMode
    path: str | None = None
    dup: int | None = None

    def __post_init__(self) -> None:
        _int(self.fd, "redirect fd", 0, MAX_FD)
        _choice(self.mode, "redirect mode", get_args(RedirectMode))
        if self.dup is not None:
            _int(self.dup, "redirect dup", 0, MAX_FD)

    def to_wire(self) -> dict[str, Any]:
        return {"fd": self.fd, "mode": self.mode, "path": self.path, "dup": self.dup}

    @classmethod
    def from_wire(cls, data: Any, what: str = "redirect") -> Redirect:
        d = _obj(data, what, ("fd", "mode", "path", "dup"), ("fd", "mode"))
        dup = d.get("dup")
        return cls(fd=_int(d["fd"], f"{what}.fd", 0, MAX_FD),
                   mode=cast(RedirectMode, _choice(d["mode"], f"{what}.mode",
                                                   get_args(RedirectMode))),
                   path=_opt_text(d.get("path"), f"{what}.path"),
                   dup=None if dup is None else _int(dup, f"{what}.dup", 0, MAX_FD))


@dataclass(frozen=True)
class PlannedCommand:
    """One program to start: exactly this argv (no shell, no expansion), with ``env`` added
    to the backend's environment. ``exec_only``: the process (and everything it starts) may
    execute only these programs (names looked up on PATH) and files beneath these absolute
    directories - kernel-enforced (Landlock) or the command is refused; ``None``: no such
    restriction."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    exec_only: tuple[str, ...] | None = None
    redirects: tuple[Redirect, ...] = ()

    def __post_init__(self) -> None:
        _freeze(self, "argv", "exec_only", "redirects")
        if not self.argv:
            raise ValueError("a planned command needs at least one word")

    def to_wire(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "env": dict(self.env),
                "exec_only": None if self.exec_only is None else list(self.exec_only),
                "redirects": [r.to_wire() for r in self.redirects]}

    @classmethod
    def from_wire(cls, data: Any, what: str = "command") -> PlannedCommand:
        d = _obj(data, what, ("argv", "env", "exec_only", "redirects"), ("argv",))
        env = d.get("env", {})
        if not isinstance(env, dict) or len(env) > MAX_ENV:
            raise ValueError(f"{what}.env must be an object of at most {MAX_ENV} entries")
        exec_only = d.get("exec_only")
        return cls(
            argv=_list(d["argv"], f"{what}.argv", MAX_WORDS, _text, least=1),
            env={_text(k, f"{what}.env key"): _text(v, f"{what}.env[{k}]")
                 for k, v in env.items()},
            exec_only=(None if exec_only is None
                       else _list(exec_only, f"{what}.exec_only", MAX_NAMES, _text)),
            redirects=_list(d.get("redirects", []), f"{what}.redirects", MAX_REDIRECTS,
                            Redirect.from_wire))


@dataclass(frozen=True)
class Pipeline:
    """Commands joined by pipes (the pipeline's status is the last command's). ``run_if``
    is the operator before it: ``always`` (first, ``;``, newline), ``ok`` (``&&``: the
    previous status was 0) or ``failed`` (``||``)."""

    commands: tuple[PlannedCommand, ...]
    run_if: RunIf = "always"

    def __post_init__(self) -> None:
        _freeze(self, "commands")
        if not self.commands:
            raise ValueError("a pipeline needs at least one command")
        _choice(self.run_if, "run_if", get_args(RunIf))

    def to_wire(self) -> dict[str, Any]:
        return {"run_if": self.run_if, "commands": [c.to_wire() for c in self.commands]}

    @classmethod
    def from_wire(cls, data: Any, what: str = "pipeline") -> Pipeline:
        d = _obj(data, what, ("run_if", "commands"), ("commands",))
        return cls(commands=_list(d["commands"], f"{what}.commands", MAX_COMMANDS,
                                  PlannedCommand.from_wire, least=1),
                   run_if=cast(RunIf, _choice(d.get("run_if", "always"), f"{what}.run_if",
                                              get_args(RunIf))))


@dataclass(frozen=True)
class Plan:
    """What a command tool runs, exactly as the policy checked it: pipelines evaluated left to
    right, each skipped or run according to the status of the last one that ran (POSIX and-or
    lists); the call's exit status is that of the last pipeline that ran. Backends execute
    this structure themselves; a command line never reaches a shell."""

    pipelines: tuple[Pipeline, ...]

    def __post_init__(self) -> None:
        _freeze(self, "pipelines")
        if not self.pipelines:
            raise ValueError("a plan needs at least one pipeline")

    @classmethod
    def single(cls, argv: Sequence[str]) -> Plan:
        return cls(pipelines=(Pipeline(commands=(PlannedCommand(argv=tuple(argv)),)),))

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready form: what the container runner reads as ``req["plan"]``."""
        return {"pipelines": [p.to_wire() for p in self.pipelines]}

    @classmethod
    def from_wire(cls, data: Any) -> Plan:
        """The plan in ``data`` (:meth:`to_wire`'s form), bounded; ``ValueError`` otherwise."""
        d = _obj(data, "plan", ("pipelines",), ("pipelines",))
        return cls(pipelines=_list(d["pipelines"], "plan.pipelines", MAX_PIPELINES,
                                   Pipeline.from_wire, least=1))

    def render(self) -> str:
        """The plan written as a command line, every word quoted (for people: audit records,
        ``policy explain``); environment and exec restrictions are not shown."""
        modes = {"read": "<", "write": ">", "append": ">>", "readwrite": "<>"}
        joins = {"always": "; ", "ok": " && ", "failed": " || "}
        out = ""
        for i, pipeline in enumerate(self.pipelines):
            if i:
                out += joins[pipeline.run_if]
            words = []
            for cmd in pipeline.commands:
                text = " ".join(shlex.quote(a) for a in cmd.argv)
                for r in cmd.redirects:
                    target = ("-" if r.mode == "close" else str(r.dup) if r.mode == "dup"
                              else shlex.quote(r.path or ""))
                    op = ">&" if r.mode in ("dup", "close") else modes[r.mode]
                    text += f" {r.fd}{op}{target}"
                words.append(text)
            out += " | ".join(words)
        return out

    @property
    def argv(self) -> list[str] | None:
        """The argv of a plan that is one plain command (no redirects), else None."""
        if len(self.pipelines) == 1 and len(self.pipelines[0].commands) == 1:
            cmd = self.pipelines[0].commands[0]
            return None if cmd.redirects else list(cmd.argv)
        return None


# ---------------------------------------------------------------- the execution plan

_PLAN_KEYS = ("kind", "limits", "command", "imports_allow", "imports_deny", "image",
              "network", "path", "max_file_bytes", "display", "programs")


@dataclass(frozen=True)
class ExecutionPlan:
    """What one allowed call runs and how, as the policy decided it; the service adds only
    what it owns (the display caps of its settings, a session's quota headroom in
    ``max_file_bytes``). Backends read it and nothing else about the decision.

    ``kind``: what runs; ``command``: a command tool's plan; ``imports_allow`` /
    ``imports_deny``: the modules a python call may import; ``image``: the container image
    (None: the backend's default for the kind); ``network``: the Docker network granted
    (None: none); ``path``: the workspace-relative path a file tool opens (normalised, never
    the raw argument); ``max_file_bytes``: the largest file a call may read or write;
    ``display``: the display caps; ``limits``: the effective limits; ``programs``: the
    programs a bash call may execute (the shell tool's ``commands``, allowed and not denied)."""

    kind: ToolKind
    limits: Limits = field(default_factory=Limits)
    command: Plan | None = None
    imports_allow: tuple[str, ...] = ()
    imports_deny: tuple[str, ...] = ()
    image: str | None = None
    network: str | None = None
    #: the daemon's compiled egress rules (``sandboxd.egress.rules.EgressRules``); None: no
    #: egress proxy. Never sent to a sandbox: the proxy enforces them outside it
    egress: Any = None
    path: str | None = None
    max_file_bytes: int = 1024 * 1024
    display: DisplayCaps = field(default_factory=DisplayCaps)
    programs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _freeze(self, "imports_allow", "imports_deny", "programs")

    @property
    def argv(self) -> list[str] | None:
        """The command plan's argv when it is one plain command, else None."""
        return self.command.argv if self.command is not None else None

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready form (:meth:`from_wire` reads it back)."""
        return {"kind": self.kind.value, "limits": self.limits.to_wire(),
                "command": None if self.command is None else self.command.to_wire(),
                "imports_allow": list(self.imports_allow),
                "imports_deny": list(self.imports_deny), "image": self.image,
                "network": self.network, "path": self.path,
                "max_file_bytes": self.max_file_bytes, "display": self.display.wire(),
                "programs": list(self.programs)}

    @classmethod
    def from_wire(cls, data: Any) -> ExecutionPlan:
        """The plan in ``data``, every value checked and bounded; ``ValueError`` otherwise."""
        d = _obj(data, "execution plan", _PLAN_KEYS, _PLAN_KEYS[:-1])  # programs: optional
        try:
            kind = ToolKind(d["kind"])
        except ValueError:
            raise ValueError(f"kind must be one of {[k.value for k in ToolKind]}") from None
        return cls(
            kind=kind, limits=Limits.from_wire(d["limits"]),
            command=None if d["command"] is None else Plan.from_wire(d["command"]),
            imports_allow=_list(d["imports_allow"], "imports_allow", MAX_NAMES, _text),
            imports_deny=_list(d["imports_deny"], "imports_deny", MAX_NAMES, _text),
            image=_opt_text(d["image"], "image"), network=_opt_text(d["network"], "network"),
            path=_opt_text(d["path"], "path"),
            max_file_bytes=_int(d["max_file_bytes"], "max_file_bytes", 0, MAX_FILE_BYTES),
            display=DisplayCaps.from_wire(d["display"]),
            programs=_list(d.get("programs", []), "programs", MAX_NAMES, _text))
