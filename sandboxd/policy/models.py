"""The policy file format (pydantic models of the YAML).

One file is one policy::

    version: 1
    name: default
    clients: ["*"]                  # client names, or "*" for every client without its own policy
    limits: {timeout: 60s, max_timeout: 300s, memory: 256Mi, cpus: 1.0, pids: 64, output: 1Mi}
    network: none                   # or the name of a Docker network to grant (never "host")
    egress: {allow: ["pypi.org:443"]}   # or hosts through the egress proxy (sandboxd.egress)
    tools:
      python: {backend: restricted, imports: {allow: [math, json]}}
      shell:  {backend: container, commands: {allow: [ls, cat], deny: [curl]}, operators: false}
      read_file: {paths: {allow: ["**"], deny: ["**/.env"]}, max_bytes: 1Mi}
    custom_tools:
      git_status: {description: "...", backend: container, argv: [git, status, --short]}

Semantic checks that need more than one field (limits above maxima, placeholders that name no
parameter, ...) live in :mod:`sandboxd.policy.checks`, which reports exact key locations.
"""

from __future__ import annotations

import re
import string
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from sandboxd.backends import registry
from sandboxd.egress.rules import EgressSpec
from sandboxd.policy.units import parse_duration, parse_size
from sandboxd.protocol.limits import LIMITS
from sandboxd.tools import PACKAGES_TOOL as PACKAGES_TOOL  # (the policy's name for it)

Loc = tuple[str | int, ...]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PROGRAM = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_NETWORK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
#: a package name (PEP 508), optionally pinned to one version (PEP 440 public versions)
PACKAGE_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?)"
                          r"(==(?P<version>[0-9][0-9A-Za-z.!+-]{0,63}))?$")


def _check(pattern: re.Pattern[str], what: str) -> Any:
    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(f"{value!r} is not a valid {what}")
        return value

    return AfterValidator(check)


def _client(value: str) -> str:
    if value != "*" and not _NAME.match(value):
        raise ValueError(f"{value!r} is not a valid client name (letters, digits, '_', '.', '-')")
    return value


def _module(value: str) -> str:
    if value != "*" and not _MODULE.match(value):
        raise ValueError(f"{value!r} is not a valid module name (or '*' for any module)")
    return value


def _glob(value: str) -> str:
    if not value or value.startswith("/"):
        raise ValueError(f"{value!r}: path globs are relative to the workspace")
    if ".." in value.split("/"):
        raise ValueError(f"{value!r}: path globs must not contain '..'")
    return value


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"invalid regular expression {value!r}: {exc}") from None
    return value


def _network(value: str) -> str:
    if value == "none":
        return value
    if value == "host" or value.startswith("container:") or not _NETWORK.match(value):
        raise ValueError(
            f"network {value!r} is not allowed: use 'none' or the name of a Docker network"
        )
    return value


def _serving(group: registry.ToolGroup) -> Any:
    """A tool's ``backend:`` is the name of a registered backend that serves ``group`` (the
    error lists them, as pydantic lists a Literal's values)."""
    def check(value: str) -> str:
        choices = registry.names(group)
        if value not in choices:
            raise PydanticCustomError("literal_error", "Input should be {expected}",
                                      {"expected": registry.quoted(choices)})
        return value

    return AfterValidator(check)


def _default_for(group: registry.ToolGroup) -> Any:
    """Without ``backend:``, the registry's default backend for ``group``."""
    return Field(default_factory=lambda: registry.default_for(group))


Duration = Annotated[float, BeforeValidator(parse_duration)]
Size = Annotated[int, BeforeValidator(parse_size)]
ClientName = Annotated[str, AfterValidator(_client)]
ProgramName = Annotated[str, _check(_PROGRAM, "program name (a bare name such as 'ls', no '/')")]
ModuleName = Annotated[str, AfterValidator(_module)]
PathGlob = Annotated[str, AfterValidator(_glob)]
Regex = Annotated[str, AfterValidator(_regex)]
Network = Annotated[str, AfterValidator(_network)]
PolicyName = Annotated[str, _check(_NAME, "policy name (letters, digits, '_', '.', '-')")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: every key of a ``limits:`` block (``memory``, ``max_memory``, ...) and its limit
LIMIT_OF_KEY = {key: info for info in LIMITS.values() for key in (info.policy, info.policy_max)}


class LimitsSpec(_Strict):
    """Default limits and their maxima. Unset values are inherited (tool <- policy <- built-in)."""

    timeout: Duration | None = None
    max_timeout: Duration | None = None
    memory: Size | None = None
    max_memory: Size | None = None
    cpus: Annotated[float, Field(gt=0)] | None = None
    max_cpus: Annotated[float, Field(gt=0)] | None = None
    pids: Annotated[int, Field(gt=0, strict=True)] | None = None
    max_pids: Annotated[int, Field(gt=0, strict=True)] | None = None
    output: Size | None = None
    max_output: Size | None = None
    open_files: Annotated[int, Field(strict=True)] | None = None
    max_open_files: Annotated[int, Field(strict=True)] | None = None

    @field_validator("*")
    @classmethod
    def _within_bounds(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and info.field_name is not None:
            LIMIT_OF_KEY[info.field_name].check(info.field_name, value)
        return value


class ImportRules(_Strict):
    allow: list[ModuleName] = Field(default_factory=list)
    deny: list[ModuleName] = Field(default_factory=list)


def _package(value: str) -> str:
    if not PACKAGE_SPEC.match(value):
        raise ValueError(f"{value!r} is not a package name, or a name and an exact version "
                         "such as 'name==1.2'")
    return value


PackageSpec = Annotated[str, AfterValidator(_package)]


class ApprovalSpec(_Strict):
    """``approve:``: a call this rule admits waits for a person's yes (docs/policy.md).
    ``by``: the clients that may approve over HTTP; ``elicit``: the calling MCP host's user
    may answer too; ``patterns`` (shell only): only command lines one of them matches wait."""

    by: list[ClientName] = Field(default_factory=list)
    elicit: bool = False
    approval_timeout_s: Annotated[float, Field(gt=0, le=86400)] = 300.0
    patterns: list[Regex] = Field(default_factory=list)


class PackageRules(_Strict):
    """``tools.python.packages``: what ``install_packages`` may install (names compared
    after PEP 503 normalisation; ``name==version`` pins the one version allowed)."""

    allow: list[PackageSpec] = Field(default_factory=list)
    approve: ApprovalSpec | None = None


class CommandRules(_Strict):
    allow: list[ProgramName] = Field(default_factory=list)
    deny: list[ProgramName] = Field(default_factory=list)


class PathRules(_Strict):
    allow: list[PathGlob] = Field(default_factory=list)
    deny: list[PathGlob] = Field(default_factory=list)


class _ToolBase(_Strict):
    enabled: bool = True
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    approve: ApprovalSpec | None = None


class PythonTool(_ToolBase):
    """``tools.python``: run code; imports are checked against ``imports``."""

    backend: Annotated[str, _serving("python")] = _default_for("python")
    image: str | None = None
    network: Network | None = None
    egress: EgressSpec | None = None
    imports: ImportRules = Field(default_factory=ImportRules)
    packages: PackageRules = Field(default_factory=PackageRules)


class ShellTool(_ToolBase):
    """``tools.shell``: run a command line; every program is checked against ``commands``."""

    backend: Annotated[str, _serving("shell")] = _default_for("shell")
    image: str | None = None
    network: Network | None = None
    egress: EgressSpec | None = None
    commands: CommandRules = Field(default_factory=CommandRules)
    operators: bool = False
    deny_patterns: list[Regex] = Field(default_factory=list)


class BashTool(_ToolBase):
    """``tools.bash``: bash code in a session's bash kernel (state kept between calls). What
    it may run is ``tools.shell.commands``: one rule for both tools."""

    backend: Annotated[str, _serving("shell")] = _default_for("shell")
    image: str | None = None
    network: Network | None = None


class FileTool(_ToolBase):
    """``tools.read_file`` / ``write_file`` / ``list_files``: workspace paths, in the daemon."""

    backend: Annotated[str, _serving("files")] = _default_for("files")
    paths: PathRules = Field(default_factory=PathRules)
    max_bytes: Size = 1024 * 1024


class Tools(_Strict):
    python: PythonTool | None = None
    shell: ShellTool | None = None
    bash: BashTool | None = None
    read_file: FileTool | None = None
    write_file: FileTool | None = None
    list_files: FileTool | None = None


def _default_parameters() -> dict[str, Any]:
    return {"type": "object", "properties": {}, "additionalProperties": False}


class ToolHintsSpec(_Strict):
    """``custom_tools.<name>.annotations``: what the tool does to its sandbox, for MCP hosts
    (``readOnlyHint``...; the network decides ``openWorldHint``)."""

    read_only: bool = False
    destructive: bool = True
    idempotent: bool = False


class CustomTool(_ToolBase):
    """``custom_tools.<name>``: an admin-defined command with an argv template."""

    description: Annotated[str, Field(min_length=1)]
    title: Annotated[str, Field(min_length=1, max_length=100)] | None = None
    annotations: ToolHintsSpec = Field(default_factory=ToolHintsSpec)
    parameters: dict[str, Any] = Field(default_factory=_default_parameters)
    backend: Annotated[str, _serving("custom")] = _default_for("custom")
    image: str | None = None
    network: Network | None = None
    egress: EgressSpec | None = None
    argv: Annotated[list[str], Field(min_length=1)]
    # a placeholder value starting with '-' could smuggle an option into the program; refused
    # unless the admin says the program treats such values safely
    allow_option_values: bool = False


class PolicyFile(_Strict):
    """One policy file."""

    version: Literal[1]
    name: PolicyName
    description: str = ""
    clients: Annotated[list[ClientName], Field(min_length=1)]
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    network: Network = "none"
    egress: EgressSpec | None = None
    tools: Tools = Field(default_factory=Tools)
    custom_tools: dict[str, CustomTool] = Field(default_factory=dict)


# ------------------------------------------------------------------ names the checks share

BUILTIN_NAMES = ("python", "shell", "bash", "read_file", "write_file", "list_files")
#: the registry's name for what each built-in tool asks of its backend
TOOL_GROUPS: dict[str, registry.ToolGroup] = {
    "python": "python", "shell": "shell", "bash": "shell",
    "read_file": "files", "write_file": "files", "list_files": "files"}


def placeholders(element: str) -> list[str]:
    """The ``{name}`` placeholders of one argv template element (``{{``/``}}`` are literal).

    Raises ``ValueError`` for anything but plain names (no ``{x.attr}``, ``{x!r}``, ``{x:>9}``).
    """
    names: list[str] = []
    for _literal, field, spec, conversion in string.Formatter().parse(element):
        if field is None:
            continue
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", field) or spec or conversion:
            raise ValueError(
                f"placeholder {{{field}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}} must be a plain parameter name such as {{path}}"
            )
        names.append(field)
    return names


def normalise_package(name: str) -> str:
    """A distribution name as PEP 503 compares it: runs of ``-``, ``_``, ``.`` become one
    ``-``, lower case (the PEP's own definition)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def allowed_packages(entries: list[str]) -> dict[str, str]:
    """``packages.allow`` as {normalised name: the requirement pip gets (``name`` or
    ``name==version``)}."""
    out: dict[str, str] = {}
    for entry in entries:
        match = PACKAGE_SPEC.match(entry)
        if match is not None:
            name = normalise_package(match["name"])
            out[name] = name + (f"=={match['version']}" if match["version"] else "")
    return out


def placeholders_in(element: str) -> bool:
    """Whether an argv element contains a placeholder (invalid ones count as placeholders)."""
    try:
        return bool(placeholders(element))
    except ValueError:
        return True
