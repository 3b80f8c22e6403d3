"""The built-in tools: names, descriptions, JSON Schemas of their arguments, and kinds.

Admin-defined tools come from policy files (``custom_tools``); the policy engine turns them
into :class:`~sandboxd.models.ToolSpec` objects of the same shape. Arguments are validated
against a tool's schema (:func:`validate_arguments`) before the policy engine or any backend
sees them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from sandboxd.errors import SandboxdError
from sandboxd.models import ToolKind
from sandboxd.protocol.environment import MAX_VARS


@dataclass(frozen=True)
class Hints:
    """What a tool does to its sandbox, as MCP's tool annotations say it (``readOnlyHint``,
    ``destructiveHint``, ``idempotentHint``; ``openWorldHint`` follows the tool's network)."""

    read_only: bool = False
    destructive: bool = True
    idempotent: bool = False

    def annotations(self, network: str) -> dict[str, bool]:
        """MCP's names; a read-only tool says nothing of the other two (they mean nothing)."""
        hints = {"readOnlyHint": self.read_only}
        if not self.read_only:
            hints |= {"destructiveHint": self.destructive, "idempotentHint": self.idempotent}
        return hints | {"openWorldHint": network != "none"}


@dataclass(frozen=True)
class BuiltinTool:
    """A tool the daemon knows without any policy file."""

    name: str
    kind: ToolKind
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)
    title: str = ""
    hints: Hints = Hints()


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


#: the ``encoding`` argument of read_file / write_file
ENCODING: dict[str, Any] = {
    "type": "string", "enum": ["utf-8", "base64"], "default": "utf-8",
    "description": "utf-8: the content is text; base64: the content is the file's bytes in "
                   "standard base64 (binary files)"}


#: the built-in tool the python tool's ``packages.allow`` enables (off unless a policy lists
#: packages: installing code into a session widens what it can run)
PACKAGES_TOOL = "install_packages"

BUILTIN_TOOLS: dict[str, BuiltinTool] = {
    t.name: t
    for t in (
        BuiltinTool(
            "python",
            ToolKind.python,
            "Run Python code in a sandbox. Returns stdout, stderr and the value of the last "
            "expression. Within a session, variables, functions and imports persist between "
            "calls (until a timeout, a limit or a restart ends the interpreter; files stay); "
            "without one, every call starts fresh. display(obj) shows a value (a table, a "
            "chart) beside the output. Only allowlisted modules can be imported; there is no "
            "network.",
            _object(
                {"code": {"type": "string", "minLength": 1, "description": "Python source code"}},
                ["code"],
            ),
            title="Run Python code",
            hints=Hints(),
        ),
        BuiltinTool(
            "shell",
            ToolKind.command,
            "Run one command line in a sandbox (no shell: pipes, redirects and ';' are refused "
            "unless the policy allows them). Only allowlisted programs can run.",
            _object(
                {"command": {"type": "string", "minLength": 1, "description": "Command line"},
                 "env": {"type": "object", "additionalProperties": {"type": "string"},
                         "maxProperties": MAX_VARS,
                         "description": "Environment variables added for its programs "
                                        "(PATH, LD_*, *_PROXY and the like are refused)"}},
                ["command"],
            ),
            title="Run a command",
            hints=Hints(),
        ),
        BuiltinTool(
            "bash",
            ToolKind.bash,
            "Run bash code in a sandbox. Returns stdout, stderr and the exit status of the last "
            "command. Within a session, the working directory, variables, functions and "
            "aliases persist between calls (until a timeout, a limit or a restart ends the "
            "shell; files stay); without one, every call starts fresh. Only allowlisted "
            "programs can run; there is no network.",
            _object(
                {"code": {"type": "string", "minLength": 1, "description": "Bash code"}},
                ["code"],
            ),
            title="Run Bash code",
            hints=Hints(),
        ),
        *(BuiltinTool(
            name,
            kind,
            f"Run {lang} code in a sandbox (Node.js"
            + (", transpiled from TypeScript in the sandbox" if kind is ToolKind.typescript
               else "")
            + "). Returns stdout, stderr and the value of the last expression; top-level "
            "await works; display(value) shows a value (display(bundle, {raw: true}) a MIME "
            "bundle). Within a session, globals (let, const, functions, classes, required "
            "modules) persist between calls and are shared by javascript and typescript "
            "calls (until a timeout, a limit or a restart ends the kernel; files stay); "
            "without one, every call starts fresh. Use require() or import; modules such "
            "as child_process, net and http are not allowed, and files only in the "
            "workspace and /tmp; there is no network.",
            _object(
                {"code": {"type": "string", "minLength": 1, "description": f"{lang} code"}},
                ["code"],
            ),
            title=f"Run {lang} code",
            hints=Hints(),
        ) for name, kind, lang in (("javascript", ToolKind.javascript, "JavaScript"),
                                   ("typescript", ToolKind.typescript, "TypeScript"))),
        BuiltinTool(
            "read_file",
            ToolKind.read_file,
            "Read a file from the session workspace: its text, or with encoding \"base64\" "
            "its bytes in base64 (for binary files such as images or archives).",
            _object(
                {"path": {"type": "string", "minLength": 1,
                          "description": "Path relative to the workspace"},
                 "encoding": ENCODING},
                ["path"],
            ),
            title="Read a workspace file",
            hints=Hints(read_only=True),
        ),
        BuiltinTool(
            "write_file",
            ToolKind.write_file,
            "Write (create or replace) a file in the session workspace: text, or with "
            "encoding \"base64\" binary content given in base64.",
            _object(
                {
                    "path": {"type": "string", "minLength": 1,
                             "description": "Path relative to the workspace"},
                    "content": {"type": "string", "description": "The whole new content"},
                    "encoding": ENCODING,
                },
                ["path", "content"],
            ),
            title="Write a workspace file",
            hints=Hints(idempotent=True),
        ),
        BuiltinTool(
            "list_files",
            ToolKind.list_files,
            "List the files and directories of a workspace directory.",
            _object(
                {"path": {"type": "string", "default": ".",
                          "description": "Directory relative to the workspace"}},
                [],
            ),
            title="List workspace files",
            hints=Hints(read_only=True),
        ),
        BuiltinTool(
            PACKAGES_TOOL,
            ToolKind.command,
            "Install Python packages into this session from the administrator's wheelhouse "
            "(no network); later python calls of the session can import them. Only packages "
            "the policy allows can be installed (with what they depend on); a container "
            "session is required.",
            _object(
                {"packages": {
                    "type": "array", "minItems": 1, "maxItems": 32, "uniqueItems": True,
                    "description": "Package names (a version is set by the policy, if any)",
                    "items": {"type": "string", "minLength": 1, "maxLength": 100,
                              "pattern": r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"}}},
                ["packages"],
            ),
            title="Install Python packages",
            hints=Hints(idempotent=True, destructive=False),
        ),
    )
}


class ArgumentsInvalid(SandboxdError, ValueError):
    """Arguments do not match a tool's schema. ``field`` names the offending argument."""

    code = "invalid-arguments"

    def __init__(self, tool: str, field: str, message: str) -> None:
        super().__init__(f"{tool}: argument '{field}': {message}")
        self.tool = tool
        self.field = field
        self.detail = message

    def problem_fields(self) -> dict[str, Any]:
        return {"field": self.field, "tool": self.tool}


def check_schema(schema: dict[str, Any]) -> None:
    """Raise ``SchemaError`` when ``schema`` is not a valid JSON Schema (for policy loading)."""
    Draft202012Validator.check_schema(schema)


def _lone_surrogate(arguments: dict[str, Any]) -> str | None:
    """The field path of a string in ``arguments`` that is not valid Unicode text (a
    lone surrogate such as ``"\\ud800"``, which JSON can spell but UTF-8 cannot encode).
    Iterative: nesting depth is the client's choice."""
    stack: list[tuple[str, Any]] = [("", arguments)]
    while stack:
        path, value = stack.pop()
        if not isinstance(value, str):
            stack += _children(path, value)
        elif not _is_text(value):
            return path or "(arguments)"
    return None


def _is_text(value: str) -> bool:
    """Whether ``value`` is valid Unicode text (UTF-8 can encode it)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _children(path: str, value: Any) -> list[tuple[str, Any]]:
    """The (path, value) pairs inside a dict or list: a dict's keys (as strings, at the dict's
    own path) and its values, a list's items; nothing for a scalar."""
    if isinstance(value, dict):
        return [pair for key, item in value.items()
                for pair in ((path or "(arguments)", str(key)), (_child_path(path, key), item))]
    if isinstance(value, list):
        return [(_child_path(path, i), item) for i, item in enumerate(value)]
    return []


def _child_path(path: str, key: object) -> str:
    """The path of member ``key`` under ``path`` (``a.b``; the key alone at the top)."""
    return f"{path}.{key}" if path else str(key)


#: a validator per schema object (the policy's: a reload makes new ones), kept with the schema
#: itself so that its ``id`` is not reused meanwhile; bounded (old policies' schemas go)
_VALIDATORS: dict[int, tuple[dict[str, Any], Draft202012Validator]] = {}
_VALIDATORS_MAX = 256


def _validator(schema: dict[str, Any]) -> Draft202012Validator:
    cached = _VALIDATORS.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    validator = Draft202012Validator(schema)
    if len(_VALIDATORS) >= _VALIDATORS_MAX:
        _VALIDATORS.clear()
    _VALIDATORS[id(schema)] = (schema, validator)
    return validator


def validate_arguments(tool: str, schema: dict[str, Any], arguments: dict[str, Any]) -> None:
    """Validate ``arguments`` against ``schema``; raise :class:`ArgumentsInvalid` on the first
    problem (deterministically: the shallowest, then alphabetically first, error). Every string
    must also be valid Unicode text: no tool can use a lone surrogate (a path, a command, file
    content), so it is refused here, before the policy or a backend sees it."""
    bad = _lone_surrogate(arguments)
    if bad is not None:
        raise ArgumentsInvalid(tool, bad, "contains a lone surrogate (\\ud800-\\udfff), which "
                               "is not valid Unicode text")
    try:
        validator = _validator(schema)
    except SchemaError as exc:  # pragma: no cover - policies are checked at load time
        raise ArgumentsInvalid(tool, "(schema)", str(exc)) from exc
    errors = sorted(
        validator.iter_errors(arguments),
        key=lambda e: (len(e.absolute_path), [str(p) for p in e.absolute_path], e.message),
    )
    if errors:
        raise ArgumentsInvalid(tool, *_located(errors[0], schema, arguments))


def _located(err: ValidationError, schema: dict[str, Any],
             arguments: dict[str, Any]) -> tuple[str, str]:
    """(field, message) of a validation error; a missing or unknown parameter is named."""
    path = ".".join(str(p) for p in err.absolute_path)
    if path:
        return path, err.message
    name_it = _TOP_LEVEL_ERRORS.get(str(err.validator))
    return name_it(err, schema, arguments) if name_it else ("(arguments)", err.message)


def _missing(err: ValidationError, schema: dict[str, Any],
             arguments: dict[str, Any]) -> tuple[str, str]:
    """A ``required`` error names the first missing parameter."""
    required = cast(list[str], err.validator_value)  # the schema's "required" list
    missing = [name for name in required if name not in arguments]
    return (missing[0] if missing else "(arguments)"), "is required"


def _unknown(err: ValidationError, schema: dict[str, Any],
             arguments: dict[str, Any]) -> tuple[str, str]:
    """An ``additionalProperties`` error names the first unknown parameter and the known."""
    allowed = sorted((schema.get("properties") or {}).keys())
    extra = sorted(set(arguments) - set(allowed))
    return (extra[0] if extra else "(arguments)",
            f"is not a parameter of this tool (parameters: {', '.join(allowed)})")


_TOP_LEVEL_ERRORS = {"required": _missing, "additionalProperties": _unknown}
