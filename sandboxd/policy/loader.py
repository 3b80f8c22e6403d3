"""Line-aware loading of policy files.

YAML is composed into nodes first (which carry ``start_mark`` line/column), then constructed
and validated with pydantic; every problem is mapped back to the node it concerns, so that an
admin reads ``policies/default.yaml:14:7: tools.shell.backend: Input should be 'container'``.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import re
import types
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml
from pydantic import BaseModel, ValidationError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from sandboxd.errors import SandboxdError
from sandboxd.policy.checks import semantic_problems
from sandboxd.policy.models import Loc, PolicyFile

MAX_FILE_BYTES = 1024 * 1024
MAX_NODES = 100_000


class PolicyError(SandboxdError):
    """A policy set is invalid. ``problems`` holds one ``file:line:column: message`` per problem."""

    code = "policy-invalid"

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems) if problems else "invalid policy")
        self.problems = problems


@dataclass(eq=False)
class LoadedPolicy:
    """One validated policy file."""

    name: str
    source: str  # the path as given (e.g. "policies/default.yaml"); named in every decision
    path: Path
    spec: PolicyFile
    sha256: str
    root: Node = field(repr=False)

    def locate(self, rule: str) -> str:
        """``source:line:col`` of a rule path such as ``tools.shell.commands.deny[2]`` (the
        first one when several are joined with ``, ``); just ``source`` for ``default_deny``."""
        loc = _rule_loc(rule.split(", ")[0])
        if not loc or loc[0] not in _LOCATABLE:
            return self.source
        return _where(self.source, node_at(self.root, loc, key=True))

    def position(self, loc: Loc) -> tuple[int, int]:
        """1-based (line, column) of the YAML node at ``loc`` (the closest existing parent)."""
        node = node_at(self.root, loc)
        return node.start_mark.line + 1, node.start_mark.column + 1


@dataclass(frozen=True)
class PolicySet:
    """The policies in force: which policy applies to which client."""

    policies: tuple[LoadedPolicy, ...]
    by_client: dict[str, LoadedPolicy]
    fallback: LoadedPolicy | None  # the policy with clients: ["*"]

    def for_client(self, client: str) -> LoadedPolicy | None:
        """The policy that applies to ``client`` (its own, else the ``"*"`` policy, else None)."""
        return self.by_client.get(client, self.fallback)


#: the top-level blocks whose rules :meth:`LoadedPolicy.locate` points into
_LOCATABLE = frozenset({"tools", "custom_tools", "clients", "limits", "network", "egress"})


def _rule_loc(rule: str) -> list[str | int]:
    """The loc of a rule path: ``tools.shell.commands.deny[2]`` ->
    ``["tools", "shell", "commands", "deny", 2]`` (indexes that are not numbers are dropped)."""
    loc: list[str | int] = []
    for part in rule.split("."):
        name, *indexes = part.split("[")
        if name:
            loc.append(name)
        loc.extend(int(i.rstrip("]")) for i in indexes if i.rstrip("]").isdigit())
    return loc


# ------------------------------------------------------------------ node helpers


def node_at(root: Node, loc: Iterable[str | int], *, key: bool = False) -> Node:
    """The node at ``loc`` (or the deepest existing parent). ``key``: for a final mapping key,
    return the key node rather than its value (to point at an unknown key)."""
    node = root
    parts = list(loc)
    for i, part in enumerate(parts):
        child = _child(node, part, want_key=key and i == len(parts) - 1)
        if child is None:
            return node
        node = child
    return node


def _child(node: Node, part: str | int, *, want_key: bool) -> Node | None:
    """The node ``part`` names under ``node``: a mapping's value (its key node when
    ``want_key``), or ``node`` itself when the mapping has no such key (pydantic's union and
    validator tags in a loc are skipped so); a sequence's item; None where the path ends."""
    if isinstance(node, MappingNode):
        pairs: list[tuple[Node, Node]] = node.value
        for k, v in pairs:
            if k.value == str(part):  # only a scalar key's value is a string
                return k if want_key else v
        return node
    if isinstance(node, SequenceNode) and part in range(len(node.value)):
        item: Node = node.value[part]
        return item
    return None


def _nodes(root: Node) -> Iterator[Node]:
    """Every node of the tree under ``root`` (itself first), depth first."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, MappingNode):
            stack.extend(itertools.chain.from_iterable(node.value))  # key, value, ...
        elif isinstance(node, SequenceNode):
            stack.extend(node.value)


def _duplicate_keys(node: MappingNode) -> Iterator[tuple[Node, str]]:
    """The keys a mapping repeats (YAML would silently keep the last), each blamed at the
    repetition."""
    seen: dict[str, Node] = {}
    for k, _ in node.value:
        if not isinstance(k, ScalarNode):
            continue
        first = seen.setdefault(k.value, k)
        if first is not k:
            yield k, (f"duplicate key '{k.value}' (first defined on line "
                      f"{first.start_mark.line + 1})")


def _structure_problems(root: Node) -> list[tuple[Node, str]]:
    """Duplicate keys (which YAML would silently collapse) and documents too large."""
    problems: list[tuple[Node, str]] = []
    for count, node in enumerate(_nodes(root), 1):
        if count > MAX_NODES:
            problems.append((root, f"document too large (more than {MAX_NODES} nodes)"))
            break
        if isinstance(node, MappingNode):
            problems.extend(_duplicate_keys(node))
    return problems


def _unwrap(tp: Any) -> Any:
    """``tp`` without ``Annotated`` and without the ``None`` of an optional type."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else tp
    return tp


def _model(tp: Any) -> type[BaseModel] | None:
    """``tp`` (unwrapped) when it is a pydantic model, else None."""
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _part_type(tp: Any, part: str | int) -> Any:
    """The type of ``part`` inside ``tp``: a model's field, a dict's values, a list's items;
    None when ``tp`` has no such part."""
    model = _model(tp)
    if model is not None:
        field = model.model_fields.get(str(part))
        return field.annotation if field is not None else None
    tp = _unwrap(tp)
    return typing.get_args(tp)[-1] if typing.get_origin(tp) in (dict, list) else None


def _keys_at(model: type[BaseModel], loc: Loc) -> list[str] | None:
    """The keys the schema expects at ``loc`` (None when it is not a model there)."""
    tp: Any = model
    for part in loc:
        tp = _part_type(tp, part)
        if tp is None:
            return None
    found = _model(tp)
    return list(found.model_fields) if found is not None else None


def _dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _where(source: str, node: Node) -> str:
    return f"{source}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"


_MAPPING = "expected a mapping (key: value pairs)"
#: pydantic's messages for a value of the wrong shape, said in YAML's words
_SHAPE_MESSAGES = {"model_type": _MAPPING, "dict_type": _MAPPING,
                   "model_attributes_type": _MAPPING, "list_type": "expected a list"}


def _unknown_key(root: Node, loc: Loc, err: Any, msg: str) -> tuple[Node, str]:
    """A key the schema does not have: blamed at the key, with the keys expected there."""
    node = node_at(root, loc, key=True)
    expected = _keys_at(PolicyFile, loc[:-1])
    hint = f" (expected one of: {', '.join(expected)})" if expected else ""
    if loc[:1] == ("tools",) and len(loc) == 2:
        hint += "; admin-defined tools go under custom_tools"
    return node, f"{_dotted(loc[:-1]) or '(top level)'}: unknown key '{loc[-1]}'{hint}"


def _missing_key(root: Node, loc: Loc, err: Any, msg: str) -> tuple[Node, str]:
    """A required key that is absent: blamed at the block that lacks it."""
    node = node_at(root, loc[:-1])
    return node, f"{_dotted(loc[:-1]) or '(top level)'}: missing required key '{loc[-1]}'"


def _bad_value(root: Node, loc: Loc, err: Any, msg: str) -> tuple[Node, str]:
    """A value pydantic refused: blamed at the value (an unquoted scalar read as another
    type gets the hint to quote it)."""
    node = node_at(root, loc)
    kind = err["type"]
    text = f"{_dotted(loc)}: {_SHAPE_MESSAGES.get(kind, msg)}"
    value = err.get("input")
    if kind == "string_type" and isinstance(node, ScalarNode) and not node.style:
        text += f" (YAML read {node.value} as {type(value).__name__}: put it in quotes)"
    return node, text


_PROBLEM_READERS = {"extra_forbidden": _unknown_key, "missing": _missing_key}


def _error_loc(err: Any) -> Loc:
    """The loc of one of pydantic's errors, as :data:`Loc`."""
    return tuple(p for p in err["loc"] if isinstance(p, int | str))


def _validation_problems(source: str, root: Node, exc: ValidationError) -> list[str]:
    problems = []
    for err in exc.errors(include_url=False):
        loc = _error_loc(err)
        msg = str(err["msg"]).removeprefix("Value error, ")
        node, text = _PROBLEM_READERS.get(err["type"], _bad_value)(root, loc, err, msg)
        problems.append((node.start_mark.line, node.start_mark.column, f"{_where(source, node)}: "
                         f"{text}"))
    return [p[2] for p in sorted(problems)]


def _line_column(problem: str) -> tuple[int, int]:
    """(line, column) of a ``file:line:column: message`` problem, for sorting."""
    match = re.search(r":(\d+):(\d+): ", problem)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _semantic(source: str, root: Node, spec: PolicyFile) -> list[str]:
    return [f"{_where(source, node_at(root, loc, key=_names_key(loc)))}: {_dotted(loc)}: {msg}"
            for loc, msg in semantic_problems(spec)]


# Required top-level keys get a stand-in so that the rest of a file can still be checked.
_STAND_INS: dict[Loc, Any] = {("version",): 1, ("name",): "unnamed", ("clients",): ["*"]}


def _without_invalid_parts(data: dict[str, Any], exc: ValidationError,
                           rounds: int = 5) -> PolicyFile | None:
    """The policy with every invalid part removed (a block missing a required key goes
    whole), or None when nothing valid remains; only used to find more problems."""
    data = copy.deepcopy(data)
    for _ in range(rounds):
        for err in exc.errors(include_url=False):
            _remove_error(data, err)
        data = _compact(data)
        try:
            return PolicyFile.model_validate(data)
        except ValidationError as again:
            exc = again
    return None


def _remove_error(data: dict[str, Any], err: Any) -> None:
    """Cut the part of ``data`` one validation error is about: the refused value, or the
    block that misses a key (a missing required top-level key gets its stand-in instead)."""
    loc = _error_loc(err)
    if err["type"] != "missing":
        _cut(data, loc)
    elif loc in _STAND_INS:
        data[str(loc[0])] = copy.deepcopy(_STAND_INS[loc])
    else:
        _cut(data, loc[:-1])


_CUT = object()


def _has(node: Any, part: str | int) -> bool:
    """Whether ``node`` (a dict or a list, or another value: no) holds ``part``."""
    if isinstance(node, dict):
        return part in node
    return isinstance(node, list) and part in range(len(node))


def _cut(data: Any, loc: Loc) -> None:
    """Remove the deepest existing part of ``data`` along ``loc`` (list items are blanked,
    then dropped, so indexes of later errors stay valid within one round)."""
    parent, key = None, None
    node = data
    for part in loc:
        if not _has(node, part):
            break
        parent, key, node = node, part, node[part]
    if isinstance(parent, dict):
        del parent[key]
    elif parent is not None:
        parent[key] = _CUT


def _compact(data: Any) -> Any:
    """``data`` without the list items :func:`_cut` blanked."""
    if isinstance(data, dict):
        return {k: _compact(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_compact(v) for v in data if v is not _CUT]
    return data


def _names_key(loc: Loc) -> bool:
    """Problems about a custom tool as a whole point at its name."""
    return len(loc) == 2 and loc[0] == "custom_tools"


def file_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Unloadable(Exception):
    """A policy file that cannot be read or parsed: its problems, each at file:line:col."""

    def __init__(self, *problems: str) -> None:
        super().__init__(problems[0])
        self.problems = list(problems)


def _read(path: Path, source: str) -> tuple[bytes, str]:
    """The file's bytes and text, bounded and UTF-8."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _Unloadable(f"{source}:1:1: cannot read policy file: {exc.strerror or exc}") \
            from None
    if len(raw) > MAX_FILE_BYTES:
        raise _Unloadable(f"{source}:1:1: policy file larger than {MAX_FILE_BYTES} bytes")
    try:
        return raw, raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Unloadable(f"{source}:1:1: not UTF-8 text ({exc.reason} at byte "
                          f"{exc.start})") from None


def _compose(source: str, text: str) -> tuple[Node, dict[str, Any]]:
    """The YAML's node tree (kept for positions) and the mapping it constructs."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise _Unloadable(f"{source}:1:1: empty policy file (expected a mapping with "
                              "version, name, clients, tools)")
        structural = _structure_problems(root)
        if structural:
            raise _Unloadable(*(f"{_where(source, n)}: {m}" for n, m in structural))
        data = loader.construct_document(root)
    except yaml.YAMLError as exc:
        raise _yaml_problem(source, exc) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise _Unloadable(f"{_where(source, root)}: a policy file must be a mapping with "
                          "version, name, clients and tools")
    return root, data


def _yaml_problem(source: str, exc: yaml.YAMLError) -> _Unloadable:
    """What the YAML parser refused, at the position it marks (else at 1:1)."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return _Unloadable(f"{source}:1:1: YAML error: {exc}")
    mark = exc.problem_mark or exc.context_mark
    line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    what = " ".join(filter(None, (exc.context, exc.problem)))
    return _Unloadable(f"{source}:{line}:{col}: YAML syntax error: {what}")


def _invalid_file_problems(source: str, root: Node, data: dict[str, Any],
                           exc: ValidationError) -> list[str]:
    """Every problem of a file pydantic refused, in one run: its validation errors, and the
    semantic checks of whatever still validates once the invalid parts are cut away."""
    problems = _validation_problems(source, root, exc)
    repaired = _without_invalid_parts(data, exc)
    if repaired is not None:
        seen = set(problems)
        problems += [p for p in _semantic(source, root, repaired) if p not in seen]
    return sorted(problems, key=_line_column)


def load_file(path: Path, source: str | None = None) -> tuple[LoadedPolicy | None, list[str]]:
    """Parse and validate one policy file: ``(policy, [])`` or ``(None, problems)``."""
    source = source or str(path)
    try:
        raw, text = _read(path, source)
        root, data = _compose(source, text)
    except _Unloadable as exc:
        return None, exc.problems
    try:
        spec = PolicyFile.model_validate(data)
    except ValidationError as exc:
        return None, _invalid_file_problems(source, root, data, exc)
    problems = _semantic(source, root, spec)
    if problems:
        return None, problems
    return LoadedPolicy(spec.name, source, path, spec, file_sha256(raw), root), []


def load_set(files: list[tuple[Path, str]]) -> PolicySet:
    """Load ``[(path, source), ...]`` as one set; raise :class:`PolicyError` with every problem."""
    problems: list[str] = []
    loaded: list[LoadedPolicy] = []
    for path, source in files:
        policy, errs = load_file(path, source)
        problems.extend(errs)
        if policy is not None:
            loaded.append(policy)
    names: dict[str, LoadedPolicy] = {}
    owners: dict[str, LoadedPolicy] = {}  # client -> its policy; "*" -> the fallback
    for pol in loaded:
        first = names.setdefault(pol.name, pol)
        if first is not pol:
            line, col = pol.position(("name",))
            problems.append(f"{pol.source}:{line}:{col}: policy name '{pol.name}' is already used "
                            f"by {first.source}")
        problems.extend(_claim_clients(pol, owners))
    if problems:
        raise PolicyError(problems)
    fallback = owners.pop("*", None)
    return PolicySet(tuple(loaded), owners, fallback)


def _claim_clients(pol: LoadedPolicy, owners: dict[str, LoadedPolicy]) -> Iterator[str]:
    """Record ``pol`` in ``owners`` as the policy of each of its clients; a problem for each
    client another policy (or an earlier entry of this one) already has."""
    for i, client in enumerate(pol.spec.clients):
        other = owners.get(client)
        if other is None:
            owners[client] = pol
            continue
        line, col = pol.position(("clients", i))
        yield (f"{pol.source}:{line}:{col}: client '{client}' is already assigned to policy "
               f"'{other.name}' ({other.source})")
