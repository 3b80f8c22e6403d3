"""What one call runs, as the policy decided it: the :class:`ExecutionPlan` every layer after
the policy passes on (the service, the backends, the audit log, ``policy explain``), and the
command :class:`Plan` of a command tool (pipelines of :class:`PlannedCommand` with their
:class:`Redirect`), which the sandboxes execute as it is: a command line never reaches a shell.

Frozen dataclasses, standard library only, each a :class:`~.decode.Record` whose members carry
their bounds: :meth:`to_wire` gives the JSON-ready form (a command plan's is the very form the
container runner reads as ``req["plan"]``), :meth:`from_wire` decodes it with every list,
string and number bounded (``ValueError`` for anything else).

A python call's code is not part of the plan: it is the caller's argument (audited as such,
up to a megabyte), while the plan is what the policy made of it - which imports it may use,
where and under which limits it runs.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, get_args

from .decode import MAX_TEXT as MAX_TEXT
from .decode import Choice, Int, ListOf, MapOf, Nested, OrNone, Record, Text, member
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
    javascript = "javascript"  # run arguments["code"] in a node kernel (imports_*: modules)
    typescript = "typescript"  # the same, transpiled from TypeScript in the sandbox
    command = "command"  # run ExecutionPlan.command
    read_file = "read_file"
    write_file = "write_file"
    list_files = "list_files"


#: the kinds whose session calls run in a session kernel (state kept between calls)
KERNEL_KINDS = frozenset({ToolKind.python, ToolKind.bash, ToolKind.javascript,
                          ToolKind.typescript})
#: the runner request kind of each language's session calls (``WorkerRequest.kind``)
KERNEL_REQUESTS: dict[ToolKind, Literal["python", "bash", "javascript", "typescript"]] = {
    ToolKind.python: "python", ToolKind.bash: "bash", ToolKind.javascript: "javascript",
    ToolKind.typescript: "typescript"}
#: the languages whose kernel gets a session container of its own (one kernel per
#: container; javascript and typescript share one, and so their globals), by key suffix
KERNEL_LANES: dict[ToolKind, str] = {ToolKind.bash: " bash", ToolKind.javascript: " javascript",
                                     ToolKind.typescript: " javascript"}


# ---------------------------------------------------------------- the command plan

def freeze_lists(obj: object, *names: str) -> None:
    """Turn the list fields ``names`` of a frozen dataclass into tuples (deeply immutable)."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, list):
            object.__setattr__(obj, name, tuple(value))


_FD = Int(0, MAX_FD)
#: a list of names (exec_only, imports_allow, imports_deny, programs)
NAMES = ListOf(Text(), MAX_NAMES)


@dataclass(frozen=True)
class Redirect(Record):
    """One redirect of a planned command, in the order written: descriptor ``fd`` is opened
    on the workspace file ``path`` (``read`` ``<``, ``write`` ``>``/``>|``, ``append`` ``>>``,
    ``readwrite`` ``<>``), made a copy of descriptor ``dup`` (``>&``/``<&``), or closed
    (``>&-``). ``path`` is workspace-relative (normalised like every file-tool path) or
    ``/dev/null``; the runner opens it inside the workspace, never through a symlink."""

    WIRE_NAME = "redirect"

    fd: int = member(_FD)
    mode: RedirectMode = member(Choice(get_args(RedirectMode)))
    path: str | None = member(OrNone(Text()), None)
    dup: int | None = member(OrNone(_FD), None)

    def __post_init__(self) -> None:
        _FD.decode(self.fd, "redirect fd")
        Choice(get_args(RedirectMode)).decode(self.mode, "redirect mode")
        OrNone(_FD).decode(self.dup, "redirect dup")


@dataclass(frozen=True)
class PlannedCommand(Record):
    """One program to start: exactly this argv (no shell, no expansion), with ``env`` added
    to the backend's environment. ``exec_only``: the process (and everything it starts) may
    execute only these programs (names looked up on PATH) and files beneath these absolute
    directories - kernel-enforced (Landlock) or the command is refused; ``None``: no such
    restriction."""

    WIRE_NAME = "command"

    argv: tuple[str, ...] = member(ListOf(Text(), MAX_WORDS, least=1))
    env: dict[str, str] = member(MapOf(Text(), Text(), MAX_ENV), factory=dict)
    exec_only: tuple[str, ...] | None = member(OrNone(NAMES), None)
    redirects: tuple[Redirect, ...] = member(
        ListOf(Nested[Redirect](Redirect), MAX_REDIRECTS), ())

    def __post_init__(self) -> None:
        freeze_lists(self, "argv", "exec_only", "redirects")
        if not self.argv:
            raise ValueError("a planned command needs at least one word")


@dataclass(frozen=True)
class Pipeline(Record):
    """Commands joined by pipes (the pipeline's status is the last command's). ``run_if``
    is the operator before it: ``always`` (first, ``;``, newline), ``ok`` (``&&``: the
    previous status was 0) or ``failed`` (``||``)."""

    WIRE_NAME = "pipeline"

    run_if: RunIf = member(Choice(get_args(RunIf)), "always", kw_only=True)
    commands: tuple[PlannedCommand, ...] = member(
        ListOf(Nested[PlannedCommand](PlannedCommand), MAX_COMMANDS, least=1))

    def __post_init__(self) -> None:
        freeze_lists(self, "commands")
        if not self.commands:
            raise ValueError("a pipeline needs at least one command")
        Choice(get_args(RunIf)).decode(self.run_if, "run_if")


#: how :meth:`Plan.render` writes a redirect's mode and a pipeline's condition
_MODES = {"read": "<", "write": ">", "append": ">>", "readwrite": "<>", "dup": ">&",
          "close": ">&"}
_JOINS = {"always": "; ", "ok": " && ", "failed": " || "}


def _redirect_target(r: Redirect) -> str:
    """What a redirect goes to, as a shell writes it: a quoted path, a descriptor, or ``-``."""
    if r.mode == "close":
        return "-"
    return str(r.dup) if r.mode == "dup" else shlex.quote(r.path or "")


def _command_text(cmd: PlannedCommand) -> str:
    """One command as a shell would read it: its quoted words, then its redirects."""
    return " ".join(shlex.quote(a) for a in cmd.argv) + "".join(
        f" {r.fd}{_MODES[r.mode]}{_redirect_target(r)}" for r in cmd.redirects)


@dataclass(frozen=True)
class Plan(Record):
    """What a command tool runs, exactly as the policy checked it: pipelines evaluated left to
    right, each skipped or run according to the status of the last one that ran (POSIX and-or
    lists); the call's exit status is that of the last pipeline that ran. Backends execute
    this structure themselves; a command line never reaches a shell. Its wire form is what
    the container runner reads as ``req["plan"]``."""

    WIRE_NAME = "plan"

    pipelines: tuple[Pipeline, ...] = member(
        ListOf(Nested[Pipeline](Pipeline), MAX_PIPELINES, least=1))

    def __post_init__(self) -> None:
        freeze_lists(self, "pipelines")
        if not self.pipelines:
            raise ValueError("a plan needs at least one pipeline")

    @classmethod
    def single(cls, argv: Sequence[str]) -> Plan:
        return cls(pipelines=(Pipeline(commands=(PlannedCommand(argv=tuple(argv)),)),))

    def render(self) -> str:
        """The plan written as a command line, every word quoted (for people: audit records,
        ``policy explain``); environment and exec restrictions are not shown."""
        out = ""
        for i, pipeline in enumerate(self.pipelines):
            if i:
                out += _JOINS[pipeline.run_if]
            out += " | ".join(_command_text(cmd) for cmd in pipeline.commands)
        return out

    @property
    def argv(self) -> list[str] | None:
        """The argv of a plan that is one plain command (no redirects), else None."""
        if len(self.pipelines) == 1 and len(self.pipelines[0].commands) == 1:
            cmd = self.pipelines[0].commands[0]
            return None if cmd.redirects else list(cmd.argv)
        return None


# ---------------------------------------------------------------- the execution plan


@dataclass(frozen=True)
class ExecutionPlan(Record):
    """What one allowed call runs and how, as the policy decided it; the service adds only
    what it owns (the display caps of its settings, a session's quota headroom in
    ``max_file_bytes``). Backends read it and nothing else about the decision.

    ``kind``: what runs; ``command``: a command tool's plan; ``imports_allow`` /
    ``imports_deny``: the modules a python call may import; ``image``: the container image
    (None: the backend's default for the kind); ``network``: the Docker network granted
    (None: none); ``path``: the workspace-relative path a file tool opens (normalised, never
    the raw argument); ``max_file_bytes``: the largest file a call may read or write;
    ``display``: the display caps; ``limits``: the effective limits; ``programs``: the
    programs a bash call may execute (the shell tool's ``commands``, allowed and not denied).
    Every member but ``programs`` is required on the wire."""

    WIRE_NAME = "execution plan"
    WIRE_MEMBER = "{name}"

    kind: ToolKind = member(Choice.of(ToolKind))
    limits: Limits = member(Nested[Limits](Limits), factory=Limits, required=True)
    command: Plan | None = member(OrNone(Nested[Plan](Plan)), None, required=True)
    imports_allow: tuple[str, ...] = member(NAMES, (), required=True)
    imports_deny: tuple[str, ...] = member(NAMES, (), required=True)
    image: str | None = member(OrNone(Text()), None, required=True)
    network: str | None = member(OrNone(Text()), None, required=True)
    #: the daemon's compiled egress rules (``sandboxd.egress.rules.EgressRules``); None: no
    #: egress proxy. Never sent to a sandbox: the proxy enforces them outside it
    egress: Any = None
    path: str | None = member(OrNone(Text()), None, required=True)
    max_file_bytes: int = member(Int(0, MAX_FILE_BYTES), 1024 * 1024, required=True)
    display: DisplayCaps = member(Nested[DisplayCaps](DisplayCaps), factory=DisplayCaps,
                                  required=True)
    programs: tuple[str, ...] = member(NAMES, ())

    def __post_init__(self) -> None:
        freeze_lists(self, "imports_allow", "imports_deny", "programs")

    @property
    def argv(self) -> list[str] | None:
        """The command plan's argv when it is one plain command, else None."""
        return self.command.argv if self.command is not None else None
