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
import operator
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


_ARG_SECTIONS = frozenset({"args", "arguments", "parameters", "params", "keyword args",
                           "keyword arguments"})


def parse_google_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {argument: text})."""
    if not doc:
        return "", {}
    description, arg_sections = _split_sections(inspect.cleandoc(doc).splitlines())
    args: dict[str, str] = {}
    for section in arg_sections:
        _read_args(section, args)
    text = "\n".join(description).strip()
    # keep paragraphs but join wrapped lines
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
    return "\n\n".join(paragraphs), args


def _split_sections(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    """(the lines before the first section heading, the lines of each ``Args:``-like
    section); other sections (``Returns:``, ``Raises:``...) are left out."""
    description: list[str] = []
    arg_sections: list[list[str]] = []
    target = description
    for line in lines:
        m = _SECTION.match(line)
        if m is None:
            target.append(line)
            continue
        target = []
        if m.group(1).lower() in _ARG_SECTIONS:
            arg_sections.append(target)
    return description, arg_sections


def _read_args(lines: list[str], args: dict[str, str]) -> None:
    """Add the ``name: text`` / ``name (type): text`` entries of one section to ``args``; a
    line indented deeper than the entries continues the current one."""
    current: str | None = None
    arg_indent: int | None = None
    for line in filter(str.strip, lines):
        indent = len(line) - len(line.lstrip())
        am = _ARG_LINE.match(line)
        if am and (arg_indent is None or indent <= arg_indent):
            arg_indent = indent
            current = am.group(1)
            args[current] = am.group(3).strip()
        elif current is not None:
            args[current] = (args[current] + " " + line.strip()).strip()


_PLAIN: dict[Any, dict[str, Any]] = {
    None: {"type": "null"}, type(None): {"type": "null"},
    **{t: {"type": name} for t, name in _SCALARS.items()},
    list: {"type": "array"}, dict: {"type": "object"},
}


def type_schema(annotation: Any, where: str = "") -> dict[str, Any]:
    """JSON Schema of a Python annotation; raise :class:`ToolDefinitionError` if unsupported."""
    if annotation is inspect.Parameter.empty:
        raise ToolDefinitionError(f"{where}: no type annotation")
    if annotation in _PLAIN:
        return dict(_PLAIN[annotation])
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return _enum_schema([m.value for m in annotation], where)
    origin = get_origin(annotation)
    args = get_args(annotation)
    build = _GENERIC_BY_ORIGIN.get(origin) or _GENERIC_BY_NAME.get(getattr(origin, "__name__", ""))
    if build is None:
        raise ToolDefinitionError(f"{where}: cannot describe type {annotation!r} in JSON Schema")
    return build(annotation, origin, args, where)


def _annotated_schema(annotation: Any, origin: Any, args: tuple[Any, ...],
                      where: str) -> dict[str, Any]:
    """``Annotated[X, ...]``: X's schema (the metadata says nothing JSON Schema needs)."""
    return type_schema(args[0], where)


def _literal_schema(annotation: Any, origin: Any, args: tuple[Any, ...],
                    where: str) -> dict[str, Any]:
    """``Literal[...]``: an enum of its values."""
    return _enum_schema(list(args), where)


def _union_schema(annotation: Any, origin: Any, args: tuple[Any, ...],
                  where: str) -> dict[str, Any]:
    """``Optional[X]``/``X | None``/``Union[...]``: a type list where it suffices, else anyOf."""
    non_null = [a for a in args if a is not type(None)]
    nullable = len(non_null) != len(args)
    if len(non_null) == 1:
        inner = type_schema(non_null[0], where)
        return _nullable(inner) if nullable else inner
    options = [type_schema(a, where) for a in non_null] + ([{"type": "null"}] if nullable else [])
    return {"type": [o["type"] for o in options]} if _all_plain(options) else {"anyOf": options}


def _all_plain(options: list[dict[str, Any]]) -> bool:
    """Whether every option is a bare ``{"type": name}`` (a type list can say them all)."""
    return all(set(o) == {"type"} and isinstance(o["type"], str) for o in options)


def _nullable(inner: dict[str, Any]) -> dict[str, Any]:
    """``inner`` that also admits ``null``, folded into its ``type``/``enum`` when plain."""
    if isinstance(inner.get("type"), str) and set(inner) <= {"type", "items"}:
        return {**inner, "type": [inner["type"], "null"]}
    if "enum" in inner:
        return {**inner, "type": [inner["type"], "null"], "enum": [*inner["enum"], None]}
    return {"anyOf": [inner, {"type": "null"}]}


def _sequence_schema(annotation: Any, origin: Any, args: tuple[Any, ...],
                     where: str) -> dict[str, Any]:
    """``list[X]``, ``set[X]``, ``Sequence[X]``: an array (of unique items for sets)."""
    if len(args) != 1:
        raise ToolDefinitionError(f"{where}: {annotation!r} needs exactly one item type")
    schema: dict[str, Any] = {"type": "array", "items": type_schema(args[0], where)}
    if origin in (set, frozenset):
        schema["uniqueItems"] = True
    return schema


def _tuple_schema(annotation: Any, origin: Any, args: tuple[Any, ...],
                  where: str) -> dict[str, Any]:
    """``tuple[X, ...]`` is an array of X; ``tuple[X, Y]`` a fixed-length array."""
    if len(args) == 2 and args[1] is Ellipsis:
        return {"type": "array", "items": type_schema(args[0], where)}
    if not args:
        raise ToolDefinitionError(f"{where}: bare tuple has no item types")
    items = [type_schema(a, where) for a in args]
    return {"type": "array", "prefixItems": items, "minItems": len(items),
            "maxItems": len(items)}


def _mapping_schema(annotation: Any, origin: Any, args: tuple[Any, ...],
                    where: str) -> dict[str, Any]:
    """``dict[str, X]``/``Mapping[str, X]``: an object whose values are X."""
    if len(args) != 2 or args[0] is not str:
        raise ToolDefinitionError(f"{where}: {annotation!r}: only dict[str, X] can be "
                                  "described (JSON object keys are strings)")
    return {"type": "object", "additionalProperties": type_schema(args[1], where)}


_GenericBuilder = Callable[[Any, Any, tuple[Any, ...], str], dict[str, Any]]
_GENERIC_BY_ORIGIN: dict[Any, _GenericBuilder] = {
    typing.Annotated: _annotated_schema, Literal: _literal_schema,
    Union: _union_schema, types.UnionType: _union_schema,
    list: _sequence_schema, set: _sequence_schema, frozenset: _sequence_schema,
    typing.Sequence: _sequence_schema, typing.MutableSequence: _sequence_schema,
    tuple: _tuple_schema, dict: _mapping_schema, typing.Mapping: _mapping_schema,
}
# collections.abc origins (typing.Sequence[X] has origin collections.abc.Sequence)
_GENERIC_BY_NAME: dict[str, _GenericBuilder] = {
    "Sequence": _sequence_schema, "MutableSequence": _sequence_schema,
    "Mapping": _mapping_schema,
}

_ENUM_KINDS = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"))


def _enum_schema(values: list[Any], where: str) -> dict[str, Any]:
    kinds = set()
    for v in values:
        kind = next((name for t, name in _ENUM_KINDS if isinstance(v, t)), None)
        if kind is None:
            raise ToolDefinitionError(f"{where}: choice {v!r} is not a JSON scalar")
        kinds.add(kind)
    if len(kinds) != 1:
        raise ToolDefinitionError(f"{where}: choices mix types {sorted(kinds)}")
    return {"type": kinds.pop(), "enum": list(values)}


def function_tool_schema(fn: Callable[..., Any], *, name: str | None = None,
                         description: str | None = None) -> dict[str, Any]:
    """The OpenAI ``tools`` entry (``{"type": "function", "function": {...}}``) of ``fn``."""
    tool_name = _tool_name(fn, name)
    where = f"tool {tool_name}"
    signature, hints = _signature_and_hints(fn, where)
    summary, arg_docs = parse_google_docstring(inspect.getdoc(fn))
    text = (description or summary).strip()
    if not text:
        raise ToolDefinitionError(f"{where}: no description (give the function a docstring)")
    properties = {pname: _parameter_schema(param, hints.get(pname, param.annotation),
                                           arg_docs.get(pname, ""), f"{where}, parameter {pname!r}")
                  for pname, param in signature.parameters.items()}
    required = [pname for pname, param in signature.parameters.items()
                if param.default is param.empty]
    unknown = sorted(set(arg_docs) - set(properties))
    if unknown:
        raise ToolDefinitionError(f"{where}: docstring documents unknown parameter(s) "
                                  f"{', '.join(unknown)}")
    parameters: dict[str, Any] = {"type": "object", "properties": properties,
                                  "required": required, "additionalProperties": False}
    return {"type": "function",
            "function": {"name": tool_name, "description": text, "parameters": parameters}}


def _tool_name(fn: Callable[..., Any], name: str | None) -> str:
    """The tool's name (``name``, else the function's), checked against OpenAI's pattern."""
    tool_name = name or getattr(fn, "__name__", None)
    if not tool_name or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool_name):
        raise ToolDefinitionError(
            f"{fn!r}: tool name {tool_name!r} must match [A-Za-z0-9_-]{{1,64}}")
    return tool_name


def _signature_and_hints(fn: Callable[..., Any],
                         where: str) -> tuple[inspect.Signature, dict[str, Any]]:
    """``fn``'s signature and resolved type hints, or :class:`ToolDefinitionError`."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ToolDefinitionError(f"{where}: no inspectable signature ({exc})") from exc
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ToolDefinitionError(f"{where}: cannot resolve type hints ({exc})") from exc
    return signature, hints


def _parameter_schema(param: inspect.Parameter, annotation: Any, doc: str,
                      where: str) -> dict[str, Any]:
    """One parameter's property schema: its type, docstring choices and text, JSON default."""
    if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
        raise ToolDefinitionError(f"{where}: *args/**kwargs cannot be described")
    if param.kind is param.POSITIONAL_ONLY:
        raise ToolDefinitionError(f"{where}: positional-only parameters cannot be "
                                  "passed by name")
    schema = dict(type_schema(annotation, where))
    m = _CHOICES.search(doc)
    if m:
        schema["enum"] = _docstring_choices(m.group(1), where)
        doc = re.sub(r"\s+", " ", (doc[: m.start()] + doc[m.end():]).strip())
    if doc:
        schema["description"] = doc
    schema.update(_default_entry(param))
    return schema


def _default_entry(param: inspect.Parameter) -> dict[str, Any]:
    """``{"default": value}`` of a parameter with a default JSON can say (an Enum's value);
    else nothing: a default that is not JSON stays unstated (the parameter is optional)."""
    if param.default is param.empty:
        return {}
    default = param.default.value if isinstance(param.default, enum.Enum) else param.default
    try:
        json.dumps(default)
    except (TypeError, ValueError):
        return {}
    return {"default": default}


def _docstring_choices(text: str, where: str) -> list[Any]:
    """The JSON list of an argument's ``(choices: [...])``."""
    try:
        choices = json.loads(text)
    except ValueError as exc:
        raise ToolDefinitionError(f"{where}: (choices: ...) is not a JSON list") from exc
    if not isinstance(choices, list) or not choices:
        raise ToolDefinitionError(f"{where}: (choices: ...) must be a non-empty list")
    return choices


# ---------------------------------------------------------------- validation


class ArgumentError(ValueError):
    """Arguments do not match a schema; ``field`` names the offending argument path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"argument '{field}' {message}")
        self.field = field
        self.detail = message


_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (
        isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _type_ok(value: Any, kind: str) -> bool:
    """Whether ``value`` is of JSON type ``kind`` (an unknown kind admits anything)."""
    check = _TYPE_CHECKS.get(kind)
    return check is None or check(value)


def _describe(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def validate(schema: dict[str, Any], value: Any, path: str = "") -> None:
    """Raise :class:`ArgumentError` for the first way ``value`` breaks ``schema``."""
    if not isinstance(schema, dict):
        return
    name = path or "(arguments)"
    _check_alternatives(schema, value, path, name)
    for option in schema.get("allOf", []):
        validate(option, value, path)
    _check_type(schema, value, name)
    _check_choices(schema, value, name)
    check = next((c for t, c in _VALUE_CHECKS if isinstance(value, t)), None)
    if check is not None:
        check(schema, value, path, name)


def _check_alternatives(schema: dict[str, Any], value: Any, path: str, name: str) -> None:
    """``anyOf``/``oneOf``: the value must match at least one option (first failure shown)."""
    for key in ("anyOf", "oneOf"):
        if key in schema:
            _match_any(schema[key], value, path, name)


def _match_any(options: list[Any], value: Any, path: str, name: str) -> None:
    """Raise unless ``value`` matches one of ``options`` (the first failure is shown)."""
    errors = []
    for option in options:
        try:
            validate(option, value, path)
        except ArgumentError as exc:
            errors.append(exc)
        else:
            return
    raise ArgumentError(name, f"does not match any allowed form ({errors[0].detail})"
                        if errors else "does not match any allowed form")


def _check_type(schema: dict[str, Any], value: Any, name: str) -> None:
    """The ``type`` keyword: one JSON type or a list of them."""
    kind = schema.get("type")
    kinds = [] if kind is None else kind if isinstance(kind, list) else [kind]
    if kinds and not any(_type_ok(value, k) for k in kinds):
        raise ArgumentError(name, f"must be of type {' or '.join(kinds)}, "
                            f"got {_describe(value)}")


def _check_choices(schema: dict[str, Any], value: Any, name: str) -> None:
    """The ``const`` and ``enum`` keywords."""
    if "const" in schema and value != schema["const"]:
        raise ArgumentError(name, f"must be {_describe(schema['const'])}")
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(_describe(v) for v in schema["enum"])
        raise ArgumentError(name, f"must be one of {allowed}; got {_describe(value)}")


# (keyword, comparison that breaks it, message with {limit}) per value kind
_Bound = tuple[str, Callable[[Any, Any], bool], str]
_LENGTH_BOUNDS: tuple[_Bound, ...] = (
    ("minLength", operator.lt, "must be at least {limit} character(s) long"),
    ("maxLength", operator.gt, "must be at most {limit} characters long"),
)
_NUMBER_BOUNDS: tuple[_Bound, ...] = (
    ("minimum", operator.lt, "must be >= {limit}"),
    ("maximum", operator.gt, "must be <= {limit}"),
    ("exclusiveMinimum", operator.le, "must be > {limit}"),
    ("exclusiveMaximum", operator.ge, "must be < {limit}"),
)
_ITEM_BOUNDS: tuple[_Bound, ...] = (
    ("minItems", operator.lt, "must have at least {limit} item(s)"),
    ("maxItems", operator.gt, "must have at most {limit} items"),
)


def _check_bounds(schema: dict[str, Any], measure: Any, name: str,
                  bounds: tuple[_Bound, ...]) -> None:
    """Raise for the first of ``bounds`` present in ``schema`` that ``measure`` breaks."""
    for keyword, breaks, message in bounds:
        if keyword in schema and breaks(measure, schema[keyword]):
            raise ArgumentError(name, message.format(limit=schema[keyword]))


def _check_string(schema: dict[str, Any], value: str, path: str, name: str) -> None:
    """Length bounds and ``pattern`` of a string."""
    _check_bounds(schema, len(value), name, _LENGTH_BOUNDS)
    if "pattern" in schema and not re.search(schema["pattern"], value):
        raise ArgumentError(name, f"must match the pattern {schema['pattern']!r}")


def _check_number(schema: dict[str, Any], value: float, path: str, name: str) -> None:
    """``minimum``/``maximum`` and their exclusive forms."""
    _check_bounds(schema, value, name, _NUMBER_BOUNDS)


def _check_array(schema: dict[str, Any], value: list[Any], path: str, name: str) -> None:
    """Item count, each item against ``prefixItems``/``items``, then ``uniqueItems``."""
    _check_bounds(schema, len(value), name, _ITEM_BOUNDS)
    prefix = schema.get("prefixItems", [])
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else schema.get("items")
        if isinstance(sub, dict):
            validate(sub, item, f"{path}[{i}]" if path else f"[{i}]")
    if schema.get("uniqueItems") and _has_duplicates(value):
        raise ArgumentError(name, "must not contain duplicate items")


def _has_duplicates(items: list[Any]) -> bool:
    """Whether two items are the same JSON value (objects compared whatever their key order)."""
    seen = [json.dumps(v, sort_keys=True) for v in items]
    return len(set(seen)) != len(seen)


def _check_object(schema: dict[str, Any], value: dict[str, Any], path: str, name: str) -> None:
    """``required`` keys first, then each key against ``properties``/``additionalProperties``."""
    props = schema.get("properties", {})
    for req in schema.get("required", []):
        if req not in value:
            raise ArgumentError(_member_path(path, req), "is required")
    extra = schema.get("additionalProperties", True)
    for key in sorted(value):
        sub_path = _member_path(path, key)
        if key not in props and extra is False:
            allowed = ", ".join(sorted(props)) or "none"
            raise ArgumentError(sub_path, f"is not a parameter of this tool "
                                f"(parameters: {allowed})")
        validate(props.get(key, extra), value[key], sub_path)  # a non-dict schema admits all


def _member_path(path: str, key: str) -> str:
    """The path of an object's member ``key`` (``a.b``; the key alone at the top)."""
    return f"{path}.{key}" if path else key


# first match wins: a bool is an int to Python but gets no numeric checks
_VALUE_CHECKS: tuple[tuple[type | tuple[type, ...], Callable[[Any, Any, str, str], None] | None],
                     ...] = (
    (str, _check_string), (bool, None), ((int, float), _check_number),
    (list, _check_array), (dict, _check_object),
)
