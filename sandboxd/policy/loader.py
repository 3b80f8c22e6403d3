"""Line-aware loading of policy files.

YAML is composed into nodes first (which carry ``start_mark`` line/column), then constructed
and validated with pydantic; every problem is mapped back to the node it concerns, so that an
admin reads ``policies/default.yaml:14:7: tools.shell.backend: Input should be 'container'``.
"""

from __future__ import annotations

import hashlib
import re
import types
import typing
from collections.abc import Iterable
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
        first = rule.split(", ")[0]
        loc: list[str | int] = []
        for part in first.split("."):
            name, *indexes = part.split("[")
            if name:
                loc.append(name)
            loc.extend(int(i.rstrip("]")) for i in indexes if i.rstrip("]").isdigit())
        if not loc or loc[0] not in ("tools", "custom_tools", "clients", "limits", "network",
                                       "egress"):
            return self.source
        node = node_at(self.root, loc, key=True)
        return f"{self.source}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"

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


# ------------------------------------------------------------------ node helpers


def node_at(root: Node, loc: Iterable[str | int], *, key: bool = False) -> Node:
    """The node at ``loc`` (or the deepest existing parent). ``key``: for a final mapping key,
    return the key node rather than its value (to point at an unknown key)."""
    node = root
    parts = list(loc)
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, MappingNode):
            for k, v in node.value:
                if isinstance(k, ScalarNode) and k.value == str(part):
                    node = k if (key and last) else v
                    break
            else:
                continue  # pydantic's union/validator tags: skip, keep the parent
        elif isinstance(node, SequenceNode) and isinstance(part, int):
            if 0 <= part < len(node.value):
                node = node.value[part]
            else:
                return node
        else:
            return node
    return node


def _structure_problems(root: Node) -> list[tuple[Node, str]]:
    """Duplicate keys (which YAML would silently collapse) and documents too large."""
    problems: list[tuple[Node, str]] = []
    count = 0
    stack = [root]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_NODES:
            problems.append((root, f"document too large (more than {MAX_NODES} nodes)"))
            break
        if isinstance(node, MappingNode):
            seen: dict[str, Node] = {}
            for k, v in node.value:
                if isinstance(k, ScalarNode):
                    if k.value in seen:
                        first = seen[k.value].start_mark.line + 1
                        problems.append((k, f"duplicate key '{k.value}' (first defined on line "
                                            f"{first})"))
                    else:
                        seen[k.value] = k
                stack.extend((k, v))
        elif isinstance(node, SequenceNode):
            stack.extend(node.value)
    return problems


def _unwrap(tp: Any) -> Any:
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _keys_at(model: type[BaseModel], loc: Loc) -> list[str] | None:
    tp: Any = model
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            f = tp.model_fields.get(str(part))
            if f is None:
                return None
            tp = f.annotation
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        elif typing.get_origin(tp) is list:
            tp = typing.get_args(tp)[0]
        else:
            return None
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return list(tp.model_fields)
    return None


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


def _validation_problems(source: str, root: Node, exc: ValidationError) -> list[str]:
    problems = []
    for err in exc.errors(include_url=False):
        loc: Loc = tuple(p for p in err["loc"] if isinstance(p, int | str))
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
_STAND_INS: dict[str, Any] = {"version": 1, "name": "unnamed", "clients": ["*"]}


def _without_invalid_parts(data: dict[str, Any], exc: ValidationError,
                           rounds: int = 5) -> PolicyFile | None:
    """The policy with every invalid part removed (a block missing a required key goes
    whole), or None when nothing valid remains; only used to find more problems."""
    import copy

    data = copy.deepcopy(data)
    for _ in range(rounds):
        for err in exc.errors(include_url=False):
            loc = tuple(p for p in err["loc"] if isinstance(p, int | str))
            if err["type"] == "missing":
                if len(loc) == 1 and loc[0] in _STAND_INS:
                    data[loc[0]] = copy.deepcopy(_STAND_INS[loc[0]])
                    continue
                loc = loc[:-1]
            _cut(data, loc)
        data = _compact(data)
        try:
            return PolicyFile.model_validate(data)
        except ValidationError as again:
            exc = again
    return None


_CUT = object()


def _cut(data: Any, loc: Loc) -> None:
    """Remove the deepest existing part of ``data`` along ``loc`` (list items are blanked,
    then dropped, so indexes of later errors stay valid within one round)."""
    parent, key = None, None
    node = data
    for part in loc:
        present = (part in node if isinstance(node, dict) else
                   isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node))
        if not present:
            break
        parent, key, node = node, part, node[part]
    if parent is None:
        return
    if isinstance(parent, dict):
        del parent[key]
    else:
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
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        what = " ".join(p for p in (exc.context, exc.problem) if p)
        raise _Unloadable(f"{source}:{line}:{col}: YAML syntax error: {what}") from None
    except yaml.YAMLError as exc:
        raise _Unloadable(f"{source}:1:1: YAML error: {exc}") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise _Unloadable(f"{_where(source, root)}: a policy file must be a mapping with "
                          "version, name, clients and tools")
    return root, data


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
        # every problem in one run: the semantic checks of whatever still validates once the
        # invalid parts are cut away
        problems = _validation_problems(source, root, exc)
        repaired = _without_invalid_parts(data, exc)
        if repaired is not None:
            seen = set(problems)
            problems += [p for p in _semantic(source, root, repaired) if p not in seen]
        return None, sorted(problems, key=_line_column)
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
    by_client: dict[str, LoadedPolicy] = {}
    fallback: LoadedPolicy | None = None
    for pol in loaded:
        if pol.name in names:
            line, col = pol.position(("name",))
            problems.append(f"{pol.source}:{line}:{col}: policy name '{pol.name}' is already used "
                            f"by {names[pol.name].source}")
        names.setdefault(pol.name, pol)
        for i, client in enumerate(pol.spec.clients):
            line, col = pol.position(("clients", i))
            other = fallback if client == "*" else by_client.get(client)
            if other is not None:
                problems.append(f"{pol.source}:{line}:{col}: client '{client}' is already "
                                f"assigned to policy '{other.name}' ({other.source})")
                continue
            if client == "*":
                fallback = pol
            else:
                by_client[client] = pol
    if problems:
        raise PolicyError(problems)
    return PolicySet(tuple(loaded), by_client, fallback)
