"""Allowlist data of the language layer: dunder names user code may define or read,
attributes always refused, builtins handed to user code, object types never handed out, and
the containers and metaclasses user code may use. Module attribute allowlists live in
:mod:`.module_allowlist`."""

from __future__ import annotations

import abc
import builtins
import collections
import decimal
import enum
import types

from RestrictedPython.transformer import (
    INSPECT_ATTRIBUTES,
)

#: data-model methods user classes may define (``def __repr__(self)``)
ALLOWED_DUNDER_DEFS = frozenset(
    [
        "__init__",
        "__repr__",
        "__str__",
        "__eq__",
        "__ne__",
        "__lt__",
        "__le__",
        "__gt__",
        "__ge__",
        "__hash__",
        "__len__",
        "__iter__",
        "__next__",
        "__contains__",
        "__getitem__",
        "__setitem__",
        "__delitem__",
        "__call__",
        "__enter__",
        "__exit__",
        "__add__",
        "__radd__",
        "__iadd__",
        "__sub__",
        "__rsub__",
        "__isub__",
        "__mul__",
        "__rmul__",
        "__imul__",
        "__truediv__",
        "__rtruediv__",
        "__floordiv__",
        "__rfloordiv__",
        "__mod__",
        "__rmod__",
        "__pow__",
        "__rpow__",
        "__neg__",
        "__pos__",
        "__abs__",
        "__invert__",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "__round__",
        "__format__",
        "__and__",
        "__or__",
        "__xor__",
        "__rand__",
        "__ror__",
        "__rxor__",
        "__lshift__",
        "__rshift__",
        "__matmul__",
        "__missing__",
        "__reversed__",
        "__getattr__",
        "__post_init__",
    ]
)
#: dunder attributes user code may *read* (method calls such as ``super().__init__()`` and
#: plain strings); everything else starting with ``__`` stays refused at compile time
ALLOWED_DUNDER_READS = ALLOWED_DUNDER_DEFS | frozenset(("__name__", "__qualname__", "__doc__"))

FORBIDDEN_ATTRS = (
    frozenset(
        [
            "gi_frame",
            "gi_code",
            "gi_yieldfrom",
            "cr_frame",
            "cr_code",
            "cr_await",
            "ag_frame",
            "ag_code",
            "ag_await",
            "tb_frame",
            "tb_next",
            "f_back",
            "f_builtins",
            "f_code",
            "f_globals",
            "f_locals",
            "f_trace",
            "co_code",
        ]
    )
    | INSPECT_ATTRIBUTES
)


def is_private_attr(name: str) -> bool:
    """``_x`` (one leading underscore, not a dunder): allowed at compile time, checked later."""
    return name.startswith("_") and not name.startswith("__") and len(name) > 1


BLOCKED_OBJECT_TYPES: tuple[type, ...] = (
    types.FrameType,
    types.TracebackType,
    types.CodeType,
)
GENERATOR_TYPES: tuple[type, ...] = (
    types.GeneratorType,
    types.CoroutineType,
    types.AsyncGeneratorType,
)
GENERATOR_ATTRS = frozenset(("send", "throw", "close"))

MUTABLE_CONTAINERS: frozenset[type] = frozenset(
    (
        list,
        dict,
        set,
        bytearray,
        collections.deque,
        collections.OrderedDict,
        collections.defaultdict,
        collections.Counter,
        collections.ChainMap,
        collections.UserDict,
        collections.UserList,
    )
)
WRITABLE_HOST_TYPES: frozenset[type] = frozenset((decimal.Context,))

#: metaclasses of allowed modules' base classes that user classes may inherit
ALLOWED_METACLASSES: frozenset[type] = frozenset((type, enum.EnumMeta, abc.ABCMeta))

SAFE_BUILTIN_NAMES = [
    "abs",
    "all",
    "any",
    "ascii",
    "bin",
    "bool",
    "bytearray",
    "bytes",
    "callable",
    "chr",
    "complex",
    "dict",
    "divmod",
    "enumerate",
    "filter",
    "float",
    "format",
    "frozenset",
    "hash",
    "hex",
    "id",
    "int",
    "isinstance",
    "issubclass",
    "iter",
    "len",
    "list",
    "map",
    "max",
    "memoryview",
    "min",
    "next",
    "object",
    "oct",
    "ord",
    "pow",
    "range",
    "repr",
    "reversed",
    "round",
    "set",
    "slice",
    "sorted",
    "str",
    "sum",
    "tuple",
    "zip",
    "property",
    "staticmethod",
    "classmethod",
    "super",
    "dir",
    "True",
    "False",
    "None",
    "NotImplemented",
    "Ellipsis",
]
SAFE_EXCEPTIONS = [
    n
    for n in dir(builtins)
    if isinstance(getattr(builtins, n), type)
    and issubclass(getattr(builtins, n), BaseException)
    and n not in ("BaseExceptionGroup", "ExceptionGroup")
]
