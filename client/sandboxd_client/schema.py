"""Tool schemas for local Python functions, and a small JSON Schema validator.

:func:`function_tool_schema` builds the OpenAI ``tools`` entry of a function from its type
hints and its Google-style docstring (``Args:`` entries ``name: text`` or ``name (type): text``;
``(choices: [...])`` in an argument's text becomes an ``enum``). Supported annotations:
``str int float bool``, ``None``, ``list[X]``/``List[X]``, ``set[X]``, ``tuple[X, ...]``,
``dict[str, X]``, bare ``list``/``dict``, ``Optional[X]``/``X | None``, ``Union``,
``Literal[...]`` and ``Enum`` subclasses. A function it cannot describe faithfully (a parameter
without annotation, ``*args``/``**kwargs``, an unsupported type, a docstring naming an unknown
parameter, no description at all) raises :class:`ToolDefinitionError` at registration.

:func:`validate` checks arguments against a schema with the keywords tools use in practice
(``type enum const required properties additionalProperties items min/maxLength minimum
maximum exclusiveMinimum exclusiveMaximum min/maxItems pattern anyOf oneOf allOf``) so that
the agent can reject a bad call before anything runs, without importing ``jsonschema``.
"""

from __future__ import annotations

import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union, get_args, get_origin


class ToolDefinitionError(TypeError):
    """A function cannot be turned into a tool schema (raised at registration)."""


_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns|Return|"
    r"Yields|Raises|Examples?|Notes?|Attributes|See Also|Warnings?|Todo)\s*:\s*$",
    re.IGNORECASE,
)
_ARG_LINE = re.compile(r"^\s*\*{0,2}(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")
_CHOICES = re.compile(r"\(choices:\s*(\[.*?\])\s*\)", re.IGNORECASE | re.DOTALL)


def parse_google_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {argument: text})."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent: int | None = None
    for line in lines:
        m = _SECTION.match(line)
        if m:
            section = m.group(1).lower()
            current, arg_indent = None, None
            continue
        if section is None:
            description.append(line)
            continue
        if section not in ("args", "arguments", "parameters", "params",
                           "keyword args", "keyword arguments"):
            continue
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        am = _ARG_LINE.match(line)
        if am and (arg_indent is None or indent <= arg_indent):
            arg_indent = indent
            current = am.group(1)
            args[current] = am.group(3).strip()
        elif current is not None:
            args[current] = (args[current] + " " + line.strip()).strip()
    text = "\n".join(description).strip()
    # keep paragraphs but join wrapped lines
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
    return "\n\n".join(paragraphs), args


def type_schema(annotation: Any, where: str = "") -> dict[str, Any]:
    """JSON Schema of a Python annotation; raise :class:`ToolDefinitionError` if unsupported."""
    if annotation is inspect.Parameter.empty:
        raise ToolDefinitionError(f"{where}: no type annotation")
    if annotation is None or annotation is type(None):
        return {"type": "null"}
    if annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    if annotation is list:
        return {"type": "array"}
    if annotation is dict:
        return {"type": "object"}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = [m.value for m in annotation]
        return _enum_schema(values, where)
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is typing.Annotated:
        return type_schema(args[0], where)
    if origin is Literal:
        return _enum_schema(list(args), where)
    if origin in (Union, types.UnionType):
        non_null = [a for a in args if a is not type(None)]
        nullable = len(non_null) != len(args)
        if len(non_null) == 1:
            inner = type_schema(non_null[0], where)
            if not nullable:
                return inner
            if isinstance(inner.get("type"), str) and set(inner) <= {"type", "items"}:
                return {**inner, "type": [inner["type"], "null"]}
            if "enum" in inner:
                return {**inner, "type": [inner["type"], "null"], "enum": [*inner["enum"], None]}
            return {"anyOf": [inner, {"type": "null"}]}
        options = [type_schema(a, where) for a in non_null]
        if nullable:
            options.append({"type": "null"})
        if all(set(o) == {"type"} and isinstance(o["type"], str) for o in options):
            return {"type": [o["type"] for o in options]}
        return {"anyOf": options}
    if origin in (list, set, frozenset, typing.Sequence, typing.MutableSequence) or (
        origin is not None and origin.__name__ in ("Sequence", "MutableSequence")
    ):
        if len(args) != 1:
            raise ToolDefinitionError(f"{where}: {annotation!r} needs exactly one item type")
        schema: dict[str, Any] = {"type": "array", "items": type_schema(args[0], where)}
        if origin in (set, frozenset):
            schema["uniqueItems"] = True
        return schema
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": type_schema(args[0], where)}
        if not args:
            raise ToolDefinitionError(f"{where}: bare tuple has no item types")
        items = [type_schema(a, where) for a in args]
        return {"type": "array", "prefixItems": items, "minItems": len(items),
                "maxItems": len(items)}
    if origin in (dict, typing.Mapping) or (origin is not None and origin.__name__ == "Mapping"):
        if len(args) != 2 or args[0] is not str:
            raise ToolDefinitionError(f"{where}: {annotation!r}: only dict[str, X] can be "
                                      "described (JSON object keys are strings)")
        return {"type": "object", "additionalProperties": type_schema(args[1], where)}
    raise ToolDefinitionError(f"{where}: cannot describe type {annotation!r} in JSON Schema")


def _enum_schema(values: list[Any], where: str) -> dict[str, Any]:
    kinds = set()
    for v in values:
        if isinstance(v, bool):
            kinds.add("boolean")
        elif isinstance(v, int):
            kinds.add("integer")
        elif isinstance(v, float):
            kinds.add("number")
        elif isinstance(v, str):
            kinds.add("string")
        else:
            raise ToolDefinitionError(f"{where}: choice {v!r} is not a JSON scalar")
    if len(kinds) != 1:
        raise ToolDefinitionError(f"{where}: choices mix types {sorted(kinds)}")
    return {"type": kinds.pop(), "enum": list(values)}


def function_tool_schema(fn: Callable[..., Any], *, name: str | None = None,
                         description: str | None = None) -> dict[str, Any]:
    """The OpenAI ``tools`` entry (``{"type": "function", "function": {...}}``) of ``fn``."""
    tool_name = name or getattr(fn, "__name__", None)
    if not tool_name or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool_name):
        raise ToolDefinitionError(
            f"{fn!r}: tool name {tool_name!r} must match [A-Za-z0-9_-]{{1,64}}")
    where = f"tool {tool_name}"
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ToolDefinitionError(f"{where}: no inspectable signature ({exc})") from exc
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ToolDefinitionError(f"{where}: cannot resolve type hints ({exc})") from exc
    summary, arg_docs = parse_google_docstring(inspect.getdoc(fn))
    text = (description or summary).strip()
    if not text:
        raise ToolDefinitionError(f"{where}: no description (give the function a docstring)")
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in signature.parameters.items():
        pwhere = f"{where}, parameter {pname!r}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(f"{pwhere}: *args/**kwargs cannot be described")
        if param.kind is param.POSITIONAL_ONLY:
            raise ToolDefinitionError(f"{pwhere}: positional-only parameters cannot be "
                                      "passed by name")
        schema = dict(type_schema(hints.get(pname, param.annotation), pwhere))
        doc = arg_docs.get(pname, "")
        m = _CHOICES.search(doc)
        if m:
            try:
                choices = json.loads(m.group(1))
            except ValueError as exc:
                raise ToolDefinitionError(f"{pwhere}: (choices: ...) is not a JSON list") from exc
            if not isinstance(choices, list) or not choices:
                raise ToolDefinitionError(f"{pwhere}: (choices: ...) must be a non-empty list")
            schema["enum"] = choices
            doc = (doc[: m.start()] + doc[m.end():]).strip()
            doc = re.sub(r"\s+", " ", doc)
        if doc:
            schema["description"] = doc
        if param.default is param.empty:
            required.append(pname)
        else:
            default = param.default
            if isinstance(default, enum.Enum):
                default = default.value
            try:
                json.dumps(default)
            except (TypeError, ValueError):
                pass  # not JSON: the parameter is optional, the default stays unstated
            else:
                schema["default"] = default
        properties[pname] = schema
    unknown = sorted(set(arg_docs) - set(properties))
    if unknown:
        raise ToolDefinitionError(f"{where}: docstring documents unknown parameter(s) "
                                  f"{', '.join(unknown)}")
    parameters: dict[str, Any] = {"type": "object", "properties": properties,
                                  "required": required, "additionalProperties": False}
    return {"type": "function",
            "function": {"name": tool_name, "description": text, "parameters": parameters}}


# ---------------------------------------------------------------- validation


class ArgumentError(ValueError):
    """Arguments do not match a schema; ``field`` names the offending argument path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"argument '{field}' {message}")
        self.field = field
        self.detail = message


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    return True


def _describe(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def validate(schema: dict[str, Any], value: Any, path: str = "") -> None:
    """Raise :class:`ArgumentError` for the first way ``value`` breaks ``schema``."""
    name = path or "(arguments)"
    if not isinstance(schema, dict):
        return
    for key in ("anyOf", "oneOf"):
        if key in schema:
            errors = []
            for option in schema[key]:
                try:
                    validate(option, value, path)
                except ArgumentError as exc:
                    errors.append(exc)
                else:
                    break
            else:
                raise ArgumentError(name, f"does not match any allowed form ({errors[0].detail})"
                                    if errors else "does not match any allowed form")
    for option in schema.get("allOf", []):
        validate(option, value, path)
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_type_ok(value, k) for k in kinds):
            raise ArgumentError(name, f"must be of type {' or '.join(kinds)}, "
                                f"got {_describe(value)}")
    if "const" in schema and value != schema["const"]:
        raise ArgumentError(name, f"must be {_describe(schema['const'])}")
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(_describe(v) for v in schema["enum"])
        raise ArgumentError(name, f"must be one of {allowed}; got {_describe(value)}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            raise ArgumentError(name, f"must be at least {schema['minLength']} character(s) long")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise ArgumentError(name, f"must be at most {schema['maxLength']} characters long")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            raise ArgumentError(name, f"must match the pattern {schema['pattern']!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise ArgumentError(name, f"must be >= {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise ArgumentError(name, f"must be <= {schema['maximum']}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            raise ArgumentError(name, f"must be > {schema['exclusiveMinimum']}")
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            raise ArgumentError(name, f"must be < {schema['exclusiveMaximum']}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            raise ArgumentError(name, f"must have at least {schema['minItems']} item(s)")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise ArgumentError(name, f"must have at most {schema['maxItems']} items")
        prefix = schema.get("prefixItems", [])
        for i, item in enumerate(value):
            sub = prefix[i] if i < len(prefix) else schema.get("items")
            if isinstance(sub, dict):
                validate(sub, item, f"{path}[{i}]" if path else f"[{i}]")
        if schema.get("uniqueItems"):
            seen = [json.dumps(v, sort_keys=True) for v in value]
            if len(set(seen)) != len(seen):
                raise ArgumentError(name, "must not contain duplicate items")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for req in schema.get("required", []):
            if req not in value:
                raise ArgumentError(f"{path}.{req}" if path else req, "is required")
        extra = schema.get("additionalProperties", True)
        for key in sorted(value):
            sub_path = f"{path}.{key}" if path else key
            if key in props:
                validate(props[key], value[key], sub_path)
            elif extra is False:
                allowed = ", ".join(sorted(props)) or "none"
                raise ArgumentError(sub_path, f"is not a parameter of this tool "
                                    f"(parameters: {allowed})")
            elif isinstance(extra, dict):
                validate(extra, value[key], sub_path)
