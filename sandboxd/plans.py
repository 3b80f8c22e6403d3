"""What a command tool runs: the :class:`Plan` the policy engine builds from a command line
(pipelines of :class:`PlannedCommand` with their :class:`Redirect`), which the backends execute
as it is; a command line never reaches a shell."""

from __future__ import annotations

import shlex
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: what a :class:`Redirect` does with its descriptor
RedirectMode = Literal["read", "write", "append", "readwrite", "dup", "close"]
#: when a :class:`Pipeline` runs, after the one before it
RunIf = Literal["always", "ok", "failed"]


class _PlanPart(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Redirect(_PlanPart):
    """One redirect of a planned command, in the order written: descriptor ``fd`` is opened
    on the workspace file ``path`` (``read`` ``<``, ``write`` ``>``/``>|``, ``append`` ``>>``,
    ``readwrite`` ``<>``), made a copy of descriptor ``dup`` (``>&``/``<&``), or closed
    (``>&-``). ``path`` is workspace-relative (normalised like every file-tool path) or
    ``/dev/null``; the runner opens it inside the workspace, never through a symlink."""

    fd: int = Field(ge=0, le=9)
    mode: RedirectMode
    path: str | None = None
    dup: int | None = Field(default=None, ge=0, le=9)


class PlannedCommand(_PlanPart):
    """One program to start: exactly this argv (no shell, no expansion), with ``env`` added
    to the backend's environment. ``exec_only``: the process (and everything it starts) may
    execute only these programs (names looked up on PATH) and files beneath these absolute
    directories - kernel-enforced (Landlock) or the command is refused; ``None``: no such
    restriction."""

    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    exec_only: list[str] | None = None
    redirects: list[Redirect] = Field(default_factory=list)


class Pipeline(_PlanPart):
    """Commands joined by pipes (the pipeline's status is the last command's). ``run_if``
    is the operator before it: ``always`` (first, ``;``, newline), ``ok`` (``&&``: the
    previous status was 0) or ``failed`` (``||``)."""

    run_if: RunIf = "always"
    commands: list[PlannedCommand] = Field(min_length=1)


class Plan(_PlanPart):
    """What a command tool runs, exactly as the policy checked it: pipelines evaluated left to
    right, each skipped or run according to the status of the last one that ran (POSIX and-or
    lists); the call's exit status is that of the last pipeline that ran. Backends execute
    this structure themselves; a command line never reaches a shell."""

    pipelines: list[Pipeline] = Field(min_length=1)

    @classmethod
    def single(cls, argv: list[str]) -> Plan:
        return cls(pipelines=[Pipeline(commands=[PlannedCommand(argv=list(argv))])])

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
            return None if cmd.redirects else cmd.argv
        return None
