"""Language layer of the restricted backend: RestrictedPython plus our guards.

This module runs *inside the confined worker process* (it is pre-imported by the zygote and
executed after the fork). It is the first of two layers: it makes the obvious escapes fail with a
message a model can act on; the process layer (:mod:`.confine`) is the real boundary.

What it adds to ``compile_restricted``:

* a transformer (:class:`SandboxTransformer`) that also allows ``nonlocal``, augmented assignment
  of attributes and items (``d[k] += 1``), common data-model method definitions
  (``__repr__``, ``__len__``...), ``super().__init__`` and reading ``__name__``/``__doc__``,
  single-underscore attributes (``self._items``; at run time only on objects of user classes),
  and that makes limit errors uncatchable (every ``except`` handler and ``finally`` block starts
  with a check that re-raises them) and captures the value of the last expression;
* guarded builtins (no ``open``/``eval``/``exec``/``compile``/``globals``/``vars``/
  ``__import__``/``breakpoint``/``input``/``help``/``exit``; ``type`` only with one argument;
  ``getattr``/``setattr``/``hasattr``/``delattr`` guarded);
* an import hook that admits only the policy allowlist (minus the denylist) *and* the modules
  this backend supports, and hands out a fresh :class:`ModuleProxy` holding only an allowlist of
  names per module - never the host module, so ``json.codecs``, ``random._os`` lead nowhere;
* ``_getattr_`` refusing frame, traceback, code, generator and coroutine internals by the
  object's type, refusing any value that is a real module, frame, traceback or code object, and
  replacing every value that *is* the real ``str.format``/``format_map`` (bound or unbound,
  however reached: ``s.format``, ``type(s).format``, ``super(S, s).format``...) by a formatter
  whose field lookups go through the same guards (``string.Formatter`` is refused);
* ``_write_`` that only lets user code mutate what it created: instances of its classes, its
  classes, its functions, and builtin containers (plus ``decimal.Context``, which lives only in
  this forked worker);
* ``SystemExit``/``KeyboardInterrupt``/``GeneratorExit`` are contained (``SystemExit(n)`` sets the
  exit code), ``MemoryError``, ``RecursionError`` and the output limit cannot be caught;
* a print collector that streams stdout to the parent with an output cap, and a
  workspace-confined, size-capped ``open``.

Compile refusals (RestrictedPython errors and syntax errors) are reported as status ``error``
(exit code 1) with the errors in stderr, not ``rejected``: the model wrote the code and needs the
message to fix it, exactly as for a run-time exception.
"""

from __future__ import annotations

import _string  # type: ignore[import-not-found]
import abc
import array
import ast
import base64
import binascii
import bisect
import builtins
import calendar
import cmath
import collections
import copy
import csv
import datetime
import decimal
import difflib
import enum
import fractions
import functools
import hashlib
import heapq
import hmac
import itertools
import json
import linecache
import math
import numbers
import operator
import os
import pprint
import random
import re
import signal
import statistics
import string
import struct
import sys
import textwrap
import time
import traceback
import types
import unicodedata
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from RestrictedPython import compile_restricted_exec
from RestrictedPython.Guards import guarded_iter_unpack_sequence, guarded_unpack_sequence
from RestrictedPython.transformer import (
    INSPECT_ATTRIBUTES,
    IOPERATOR_TO_STR,
    RestrictingNodeTransformer,
    copy_locations,
)

from sandboxd.rules import OutputBudget, PathRefused, import_verdict, normalise_path

SANDBOX_FILENAME = "<code>"

# ----------------------------------------------------------------- limit errors


class LimitExceeded(BaseException):
    """A limit of the sandbox was hit (output). Derives from BaseException and is re-raised by
    every ``except``/``finally`` of user code, so user code cannot swallow it."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class SandboxViolation(PermissionError):
    """User code tried something the language layer refuses (message for the model)."""


# tracebacks show these by their bare names, without a host module path
LimitExceeded.__module__ = SandboxViolation.__module__ = "builtins"


#: exceptions that user code may not catch (re-raised at the start of every handler)
UNCATCHABLE: tuple[type[BaseException], ...] = (LimitExceeded, MemoryError, RecursionError)


class _State:
    """Per-run mutable state (one run per forked worker)."""

    limit_hit: LimitExceeded | None = None
    memory_hit: bool = False
    value: Any = None
    has_value: bool = False


STATE = _State()


def _limit_check() -> None:
    """Inserted at the top of every ``except`` handler and ``finally`` block of user code."""
    exc = sys.exc_info()[1]
    if exc is not None and isinstance(exc, UNCATCHABLE):
        if isinstance(exc, MemoryError):
            STATE.memory_hit = True
        raise exc
    if STATE.limit_hit is not None:
        raise STATE.limit_hit


# ----------------------------------------------------------------- transformer

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

_EXTRA_FORBIDDEN_ATTRS = (
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


def _is_private_attr(name: str) -> bool:
    """``_x`` (one leading underscore, not a dunder): allowed at compile time, checked later."""
    return name.startswith("_") and not name.startswith("__") and len(name) > 1


def _call(func: str, *args: ast.expr) -> ast.Call:
    return ast.Call(func=ast.Name(func, ast.Load()), args=list(args), keywords=[])


class SandboxTransformer(RestrictingNodeTransformer):
    """RestrictedPython's transformer with the additions described in the module docstring."""

    def check_name(self, node: Any, name: str | None, allow_magic_methods: bool = False) -> None:
        if allow_magic_methods and name in ALLOWED_DUNDER_DEFS and node.col_offset != 0:
            return
        super().check_name(node, name, allow_magic_methods)

    def visit_Name(self, node: ast.Name) -> Any:
        if node.id == "__name__" and isinstance(node.ctx, ast.Load):
            return node
        return super().visit_Name(node)

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        attr = node.attr
        if attr in _EXTRA_FORBIDDEN_ATTRS:
            self.error(node, f'"{attr}" is a restricted name, that is forbidden to access.')
            return node
        load = isinstance(node.ctx, ast.Load)
        if (load and attr in ALLOWED_DUNDER_READS) or _is_private_attr(attr):
            node = self.node_contents_visit(node)
            if load:
                new = _call("_getattr_", node.value, ast.Constant(attr))
                copy_locations(new, node)
                return new
            new_value = _call("_write_", node.value)
            copy_locations(new_value, node.value)
            node.value = new_value
            return node
        return super().visit_Attribute(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> Any:
        """``x: T = v`` runs as ``x = v`` (annotations are dropped); ``x: T`` is a no-op."""
        if node.value is None:
            new: ast.stmt = ast.Pass()
            copy_locations(new, node)
            return new
        new = ast.Assign(targets=[node.target], value=node.value)
        copy_locations(new, node)
        return self.visit(new)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> Any:
        for name in node.names:
            self.check_name(node, name)
        return node

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        target = node.target
        op = IOPERATOR_TO_STR[type(node.op)]
        if isinstance(target, ast.Attribute):
            attr = target.attr
            if attr in _EXTRA_FORBIDDEN_ATTRS or (
                attr.startswith("_") and not _is_private_attr(attr)
            ):
                self.error(node, f'"{attr}" is an invalid attribute name.')
                return node
            obj = self.visit(target.value)
            value = self.visit(node.value)
            new = ast.Expr(_call("_sbx_augattr_", obj, ast.Constant(attr), ast.Constant(op), value))
            copy_locations(new, node)
            ast.fix_missing_locations(new)
            return new
        if isinstance(target, ast.Subscript):
            obj = self.visit(target.value)
            key = self.visit(target.slice)
            value = self.visit(node.value)
            new = ast.Expr(_call("_sbx_augitem_", obj, key, ast.Constant(op), value))
            copy_locations(new, node)
            ast.fix_missing_locations(new)
            return new
        return super().visit_AugAssign(node)

    def _guard_block(self, body: list[ast.stmt], where: ast.AST) -> None:
        check = ast.Expr(_call("_sbx_limit_check_"))
        copy_locations(check, where)
        ast.fix_missing_locations(check)
        body.insert(0, check)

    def visit_Try(self, node: ast.Try) -> Any:
        node = super().visit_Try(node)
        for handler in node.handlers:
            self._guard_block(handler.body, handler)
        if node.finalbody:
            self._guard_block(node.finalbody, node)
        return node

    def visit_Module(self, node: ast.Module) -> Any:
        node = super().visit_Module(node)
        if node.body and isinstance(node.body[-1], ast.Expr):
            last = node.body[-1]
            new = ast.Expr(_call("_sbx_set_value_", last.value))
            copy_locations(new, last)
            ast.fix_missing_locations(new)
            node.body[-1] = new
        return node


def compile_user_code(source: str) -> tuple[types.CodeType | None, list[str]]:
    """Compile ``source`` with :class:`SandboxTransformer`; ``(code, errors)``."""
    try:
        result = compile_restricted_exec(
            source, filename=SANDBOX_FILENAME, policy=SandboxTransformer
        )
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return None, [f"{type(exc).__name__}: {exc}"]
    return result.code, list(result.errors)


# ----------------------------------------------------------------- modules

_BLOCKED_OBJECT_TYPES: tuple[type, ...] = (
    types.FrameType,
    types.TracebackType,
    types.CodeType,
)
_GENERATOR_TYPES: tuple[type, ...] = (
    types.GeneratorType,
    types.CoroutineType,
    types.AsyncGeneratorType,
)
_GENERATOR_ATTRS = frozenset(("send", "throw", "close"))


def _public(module: types.ModuleType, *exclude: str) -> frozenset[str]:
    """Public names of a C/leaf module whose values are not modules."""
    return frozenset(
        n
        for n in dir(module)
        if not n.startswith("_")
        and n not in exclude
        and not isinstance(getattr(module, n), types.ModuleType)
    )


class SafeFormatter(string.Formatter):
    """A ``string.Formatter`` whose field lookups (``{0.attr}``, ``{0[key]}``) use the guards."""

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> Any:
        first, rest = _string.formatter_field_name_split(field_name)
        obj = self.get_value(first, args, kwargs)
        for is_attr, key in rest:
            obj = guarded_getattr(obj, key) if is_attr else guarded_getitem(obj, key)
        return obj, first


_FORMATTER = SafeFormatter()
_STR_FORMAT = str.format
_STR_FORMAT_MAP = str.format_map


def safe_format(template: str, /, *args: Any, **kwargs: Any) -> str:
    """``str.format`` with guarded field traversal."""
    if not isinstance(template, str):
        raise TypeError("format() needs a str")
    return _FORMATTER.vformat(template, args, kwargs)


def safe_format_map(template: str, mapping: Any, /) -> str:
    """``str.format_map`` with guarded field traversal."""
    if not isinstance(template, str):
        raise TypeError("format_map() needs a str")
    return _FORMATTER.vformat(template, (), mapping)


def _module_table() -> dict[str, tuple[types.ModuleType, frozenset[str]]]:
    """Supported modules and the names each proxy exposes (computed once in the zygote)."""
    table: dict[str, tuple[types.ModuleType, frozenset[str]]] = {
        "math": (math, _public(math)),
        "json": (
            json,
            frozenset(
                ["dumps", "loads", "dump", "load", "JSONDecodeError", "JSONEncoder", "JSONDecoder"]
            ),
        ),
        "re": (
            re,
            frozenset(
                [
                    "compile",
                    "search",
                    "match",
                    "fullmatch",
                    "split",
                    "findall",
                    "finditer",
                    "sub",
                    "subn",
                    "escape",
                    "error",
                    "Pattern",
                    "Match",
                    "RegexFlag",
                    "A",
                    "ASCII",
                    "I",
                    "IGNORECASE",
                    "M",
                    "MULTILINE",
                    "S",
                    "DOTALL",
                    "X",
                    "VERBOSE",
                    "U",
                    "UNICODE",
                    "NOFLAG",
                ]
            )
            & frozenset(dir(re)),
        ),
        "datetime": (
            datetime,
            frozenset(
                [
                    "date",
                    "datetime",
                    "time",
                    "timedelta",
                    "timezone",
                    "tzinfo",
                    "MINYEAR",
                    "MAXYEAR",
                    "UTC",
                ]
            )
            & frozenset(dir(datetime)),
        ),
        "statistics": (
            statistics,
            frozenset(
                [
                    "mean",
                    "fmean",
                    "geometric_mean",
                    "harmonic_mean",
                    "median",
                    "median_low",
                    "median_high",
                    "median_grouped",
                    "mode",
                    "multimode",
                    "pstdev",
                    "pvariance",
                    "stdev",
                    "variance",
                    "quantiles",
                    "NormalDist",
                    "StatisticsError",
                    "correlation",
                    "covariance",
                    "linear_regression",
                ]
            )
            & frozenset(dir(statistics)),
        ),
        "itertools": (itertools, _public(itertools)),
        "functools": (
            functools,
            frozenset(
                [
                    "reduce",
                    "partial",
                    "partialmethod",
                    "lru_cache",
                    "cache",
                    "cached_property",
                    "wraps",
                    "update_wrapper",
                    "total_ordering",
                    "cmp_to_key",
                    "singledispatch",
                    "WRAPPER_ASSIGNMENTS",
                    "WRAPPER_UPDATES",
                ]
            ),
        ),
        "collections": (
            collections,
            frozenset(
                [
                    "namedtuple",
                    "deque",
                    "Counter",
                    "OrderedDict",
                    "defaultdict",
                    "ChainMap",
                    "UserDict",
                    "UserList",
                    "UserString",
                ]
            ),
        ),
        "random": (
            random,
            frozenset(
                [
                    "random",
                    "randint",
                    "randrange",
                    "choice",
                    "choices",
                    "shuffle",
                    "sample",
                    "uniform",
                    "triangular",
                    "gauss",
                    "normalvariate",
                    "lognormvariate",
                    "expovariate",
                    "vonmisesvariate",
                    "gammavariate",
                    "betavariate",
                    "paretovariate",
                    "weibullvariate",
                    "seed",
                    "getrandbits",
                    "randbytes",
                    "Random",
                    "SystemRandom",
                ]
            )
            & frozenset(dir(random)),
        ),
        "string": (
            string,
            frozenset(
                [
                    "ascii_letters",
                    "ascii_lowercase",
                    "ascii_uppercase",
                    "digits",
                    "hexdigits",
                    "octdigits",
                    "punctuation",
                    "printable",
                    "whitespace",
                    "capwords",
                    "Template",
                ]
            ),
        ),
        "decimal": (decimal, _public(decimal)),
        "fractions": (fractions, frozenset(("Fraction",))),
        "heapq": (
            heapq,
            frozenset(
                [
                    "heappush",
                    "heappop",
                    "heapify",
                    "heapreplace",
                    "heappushpop",
                    "nlargest",
                    "nsmallest",
                    "merge",
                ]
            ),
        ),
        "bisect": (
            bisect,
            frozenset(
                ["bisect", "bisect_left", "bisect_right", "insort", "insort_left", "insort_right"]
            ),
        ),
        "textwrap": (textwrap, frozenset(["wrap", "fill", "dedent", "indent", "shorten"])),
        "time": (
            time,
            frozenset(
                [
                    "time",
                    "time_ns",
                    "monotonic",
                    "monotonic_ns",
                    "perf_counter",
                    "perf_counter_ns",
                    "process_time",
                    "sleep",
                    "strftime",
                    "gmtime",
                    "localtime",
                    "mktime",
                    "asctime",
                    "ctime",
                    "struct_time",
                ]
            ),
        ),
        "operator": (operator, _public(operator, "attrgetter", "methodcaller")),
        "struct": (struct, frozenset(["pack", "unpack", "calcsize", "iter_unpack", "error"])),
        "cmath": (cmath, _public(cmath)),
        "calendar": (
            calendar,
            frozenset(
                [
                    "isleap",
                    "leapdays",
                    "monthrange",
                    "month",
                    "calendar",
                    "weekday",
                    "monthcalendar",
                    "month_name",
                    "day_name",
                    "month_abbr",
                    "day_abbr",
                    "Calendar",
                    "TextCalendar",
                    "MONDAY",
                    "TUESDAY",
                    "WEDNESDAY",
                    "THURSDAY",
                    "FRIDAY",
                    "SATURDAY",
                    "SUNDAY",
                    "timegm",
                ]
            )
            & frozenset(dir(calendar)),
        ),
        "array": (array, frozenset(["array", "typecodes"])),
        "unicodedata": (unicodedata, _public(unicodedata)),
        "difflib": (
            difflib,
            frozenset(
                [
                    "SequenceMatcher",
                    "Differ",
                    "unified_diff",
                    "context_diff",
                    "ndiff",
                    "get_close_matches",
                    "restore",
                    "IS_CHARACTER_JUNK",
                    "IS_LINE_JUNK",
                ]
            ),
        ),
        "numbers": (numbers, frozenset(["Number", "Complex", "Real", "Rational", "Integral"])),
        "enum": (
            enum,
            frozenset(["Enum", "IntEnum", "Flag", "IntFlag", "StrEnum", "auto", "unique"])
            & frozenset(dir(enum)),
        ),
        "copy": (copy, frozenset(["copy", "deepcopy", "Error"])),
        "pprint": (pprint, frozenset(["pformat", "pp", "pprint", "isreadable", "saferepr"])),
        "base64": (
            base64,
            frozenset(
                [
                    "b64encode",
                    "b64decode",
                    "urlsafe_b64encode",
                    "urlsafe_b64decode",
                    "standard_b64encode",
                    "standard_b64decode",
                    "b32encode",
                    "b32decode",
                    "b16encode",
                    "b16decode",
                    "a85encode",
                    "a85decode",
                    "b85encode",
                    "b85decode",
                    "encodebytes",
                    "decodebytes",
                ]
            ),
        ),
        "binascii": (
            binascii,
            frozenset(
                [
                    "hexlify",
                    "unhexlify",
                    "b2a_hex",
                    "a2b_hex",
                    "b2a_base64",
                    "a2b_base64",
                    "crc32",
                    "crc_hqx",
                    "Error",
                    "Incomplete",
                ]
            ),
        ),
        "hashlib": (
            hashlib,
            frozenset(
                [
                    "md5",
                    "sha1",
                    "sha224",
                    "sha256",
                    "sha384",
                    "sha512",
                    "sha3_224",
                    "sha3_256",
                    "sha3_384",
                    "sha3_512",
                    "blake2b",
                    "blake2s",
                    "shake_128",
                    "shake_256",
                    "new",
                    "algorithms_guaranteed",
                ]
            ),
        ),
        "hmac": (hmac, frozenset(["new", "compare_digest", "digest", "HMAC"])),
        "uuid": (
            uuid,
            frozenset(
                [
                    "UUID",
                    "uuid3",
                    "uuid4",
                    "uuid5",
                    "NAMESPACE_DNS",
                    "NAMESPACE_URL",
                    "NAMESPACE_OID",
                    "NAMESPACE_X500",
                ]
            ),
        ),
        "csv": (
            csv,
            frozenset(
                [
                    "reader",
                    "writer",
                    "DictReader",
                    "DictWriter",
                    "Dialect",
                    "excel",
                    "excel_tab",
                    "unix_dialect",
                    "Sniffer",
                    "Error",
                    "QUOTE_ALL",
                    "QUOTE_MINIMAL",
                    "QUOTE_NONE",
                    "QUOTE_NONNUMERIC",
                ]
            ),
        ),
    }
    return table


MODULES = _module_table()


class _Stdout:
    """The current run's stdout stream, for helpers that print (pprint.pprint)."""

    stream: Any = None


def _pprint(obj: Any, *args: Any, **kwargs: Any) -> None:
    kwargs.pop("stream", None)
    text = pprint.pformat(obj, *args, **kwargs)
    if _Stdout.stream is not None:
        _Stdout.stream.write(text + "\n")


_EXTRA_PROXY_VALUES: dict[str, dict[str, Any]] = {
    "string": {"Formatter": SafeFormatter},
    "pprint": {"pprint": _pprint, "pp": _pprint},
}


class ModuleProxy:
    """What ``import x`` gives user code: a fresh object holding only allowlisted names.

    It keeps no reference to the host module; writes to it are refused by ``_write_``.
    """

    __slots__ = ("__dict__",)

    def __init__(self, name: str, values: dict[str, Any]) -> None:
        if "__name__" in self.__dict__:  # json.__init__(...) from user code
            raise SandboxViolation("modules cannot be modified in the sandbox")
        object.__setattr__(self, "__dict__", dict(values))
        self.__dict__["__name__"] = name

    def __repr__(self) -> str:
        return f"<module '{self.__dict__['__name__']}' (sandboxed)>"

    def __dir__(self) -> list[str]:
        return sorted(n for n in self.__dict__ if not n.startswith("_"))

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"module '{self.__dict__['__name__']}' has no attribute '{name}' in the sandbox"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise SandboxViolation("modules cannot be modified in the sandbox")

    def __delattr__(self, name: str) -> None:
        raise SandboxViolation("modules cannot be modified in the sandbox")


def _make_proxy(name: str) -> ModuleProxy:
    module, names = MODULES[name]
    values = {n: getattr(module, n) for n in names}
    values.update(_EXTRA_PROXY_VALUES.get(name, {}))
    return ModuleProxy(name, values)


class ImportHook:
    """``__import__`` of the sandbox: the policy's ``imports`` rule
    (:func:`sandboxd.rules.import_verdict`), and only modules this backend supports."""

    def __init__(self, allow: list[str], deny: list[str]) -> None:
        self.allow = list(allow)
        self.deny = list(deny)
        self.cache: dict[str, ModuleProxy] = {}

    def allowed(self, name: str, fromlist: tuple[str, ...] = ()) -> bool:
        return import_verdict(name, self.allow, self.deny, fromlist)[0]

    def __call__(
        self, name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> ModuleProxy:
        if type(fromlist) is list and level == 0 and name in sys.modules:
            # PyImport_Import() from C code of an allowed module (datetime.strftime importing
            # time): it passes a list and then takes sys.modules[name] itself; user code cannot
            # call __import__ (compiled imports pass a tuple or None), so nothing reaches it.
            return None  # type: ignore[return-value]
        if level != 0:
            raise ImportError("relative imports are not allowed in the sandbox")
        if type(name) is not str:  # a str subclass could answer the rule's comparisons itself
            raise ImportError("bad module name")
        names = tuple(f for f in fromlist if type(f) is str) if type(fromlist) is tuple else ()
        if not self.allowed(name, names):
            allowed = ", ".join(sorted(n for n in MODULES if self.allowed(n))) or "none"
            raise ImportError(
                f"import of '{name}' is not allowed by the policy; allowed modules: {allowed}"
            )
        if name not in MODULES:
            raise ImportError(
                f"module '{name}' is allowed by the policy but not available in "
                f"the restricted python backend"
            )
        proxy = self.cache.get(name)
        if proxy is None:
            proxy = self.cache[name] = _make_proxy(name)
        return proxy


# ----------------------------------------------------------------- guards

_user_classes: weakref.WeakSet[type] = weakref.WeakSet()
_MUTABLE_CONTAINERS: frozenset[type] = frozenset(
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
_WRITABLE_HOST_TYPES: frozenset[type] = frozenset((decimal.Context,))


def _is_user_class(cls: type) -> bool:
    try:
        return cls in _user_classes
    except TypeError:
        return False


def _is_user_object(obj: Any) -> bool:
    t = type(obj)
    if _is_user_class(t):
        return True
    if isinstance(obj, type) and _is_user_class(obj):
        return True
    if t is types.FunctionType:
        return obj.__code__.co_filename == SANDBOX_FILENAME
    return False


def _refuse(what: str) -> SandboxViolation:
    return SandboxViolation(f"{what} is not allowed in the sandbox")


def _guard_formatting(value: Any) -> Any:
    """The real ``str.format``/``format_map`` (bound or unbound), however it was reached
    (``s.format``, ``str.format``, ``type(s).format``, ``super(S, s).format``...), replaced by
    the guarded formatter: its field lookups (``{0.attr}``) go through :func:`guarded_getattr`."""
    if value is _STR_FORMAT:
        return safe_format
    if value is _STR_FORMAT_MAP:
        return safe_format_map
    if type(value) is types.BuiltinMethodType and isinstance(value.__self__, str):
        name = value.__name__
        if name == "format":
            return functools.partial(safe_format, value.__self__)
        if name == "format_map":
            return functools.partial(safe_format_map, value.__self__)
    return value


def _check_value(value: Any) -> Any:
    """Every value user code obtains through an attribute or item lookup passes here."""
    if isinstance(value, (types.ModuleType, _BLOCKED_OBJECT_TYPES)):
        raise _refuse(f"access to {type(value).__name__} objects")
    return _guard_formatting(value)


_MISSING = object()


def _plain_str(value: Any, what: str) -> str:
    """An exact ``str`` copy: a user ``str`` subclass could override ``startswith``,
    ``__eq__`` or ``__hash__`` to pass a check with one value and be used with another."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string")
    return str.__str__(value) if type(value) is not str else value


def guarded_getattr(obj: Any, name: Any, default: Any = _MISSING) -> Any:
    """``getattr`` for user code (and the ``getattr`` builtin)."""
    name = _plain_str(name, "attribute name")
    if name.startswith("_"):
        if name in ALLOWED_DUNDER_READS or (_is_private_attr(name) and _is_user_object(obj)):
            pass
        else:
            raise _refuse(f"access to attribute '{name}'")
    if name in _EXTRA_FORBIDDEN_ATTRS:
        raise _refuse(f"access to attribute '{name}'")
    if isinstance(obj, _BLOCKED_OBJECT_TYPES):
        raise _refuse(f"access to {type(obj).__name__} internals")
    if isinstance(obj, _GENERATOR_TYPES) and name not in _GENERATOR_ATTRS:
        raise _refuse(f"access to {type(obj).__name__} internals")
    if (
        isinstance(obj, type)
        and issubclass(obj, string.Formatter)
        and obj is not SafeFormatter
        and not _is_user_class(obj)
    ):
        raise _refuse("string.Formatter")
    try:
        value = getattr(obj, name)
    except AttributeError:
        if default is _MISSING:
            raise
        return default
    return _check_value(value)


def guarded_hasattr(obj: Any, name: Any) -> bool:
    try:
        guarded_getattr(obj, name)
    except (AttributeError, SandboxViolation):
        return False
    return True


def guarded_getitem(obj: Any, key: Any) -> Any:
    return _check_value(obj[key])


def guarded_write(obj: Any) -> Any:
    """``_write_``: only objects created by user code (and builtin containers) are writable."""
    t = type(obj)
    if t in _MUTABLE_CONTAINERS or t in _WRITABLE_HOST_TYPES or _is_user_object(obj):
        return obj
    if isinstance(obj, ModuleProxy):
        raise SandboxViolation("modules cannot be modified in the sandbox")
    raise SandboxViolation(
        f"cannot modify {t.__name__} objects in the sandbox: only objects created by your "
        f"code can be modified"
    )


def guarded_setattr(obj: Any, name: str, value: Any) -> None:
    name = _plain_str(name, "attribute name")
    if name.startswith("_") and not _is_private_attr(name):
        raise _refuse(f"setting attribute '{name}'")
    setattr(guarded_write(obj), name, value)


def guarded_delattr(obj: Any, name: str) -> None:
    name = _plain_str(name, "attribute name")
    if name.startswith("_") and not _is_private_attr(name):
        raise _refuse(f"deleting attribute '{name}'")
    delattr(guarded_write(obj), name)


_INPLACE_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "+=": operator.iadd,
    "-=": operator.isub,
    "*=": operator.imul,
    "/=": operator.itruediv,
    "//=": operator.ifloordiv,
    "%=": operator.imod,
    "**=": operator.ipow,
    "<<=": operator.ilshift,
    ">>=": operator.irshift,
    "&=": operator.iand,
    "|=": operator.ior,
    "^=": operator.ixor,
    "@=": operator.imatmul,
}


def inplacevar(op: str, x: Any, y: Any) -> Any:
    return _INPLACE_OPS[op](x, y)


def augattr(obj: Any, name: str, op: str, value: Any) -> None:
    target = guarded_write(obj)
    setattr(target, name, inplacevar(op, guarded_getattr(obj, name), value))


def augitem(obj: Any, key: Any, op: str, value: Any) -> None:
    target = guarded_write(obj)
    target[key] = inplacevar(op, guarded_getitem(obj, key), value)


def apply(func: Any, *args: Any, **kwargs: Any) -> Any:
    return func(*args, **kwargs)


def getiter(obj: Any) -> Any:
    return iter(obj)


#: metaclasses of allowed modules' base classes that user classes may inherit
_ALLOWED_METACLASSES: frozenset[type] = frozenset((type, enum.EnumMeta, abc.ABCMeta))


def metaclass(name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> type:
    """Creates every class of user code and records it as user-created. A base class of an
    allowed module may bring its metaclass (``enum.Enum``, ``numbers.Number``); any other
    metaclass (including subclasses of ``type``) is refused."""
    meta: type = type
    for base in bases:
        base_meta = type(base)
        if issubclass(base_meta, meta):
            meta = base_meta
        elif not issubclass(meta, base_meta):
            raise TypeError("metaclass conflict between the base classes")
    if meta not in _ALLOWED_METACLASSES:
        raise _refuse(f"classes with the metaclass {meta.__name__}")
    if meta is type:
        cls = type(name, bases, namespace)
    else:
        prepared = meta.__prepare__(name, bases)
        for key, value in namespace.items():
            prepared[key] = value
        cls = meta(name, bases, prepared)
    _user_classes.add(cls)
    return cls


class _TypeMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, type)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return isinstance(sub, type) and issubclass(sub, type)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) != 1 or kwargs:
            raise _refuse("type() with more than one argument")
        result = type(args[0])
        # the type of a class is a metaclass (``type`` itself, EnumType...), which would create
        # classes when called with three arguments: hand out this guarded ``type`` instead
        return cls if issubclass(result, type) else result


class SafeType(metaclass=_TypeMeta):
    """``type(x)`` only; isinstance(cls, type) keeps working."""


# ----------------------------------------------------------------- output


class OutputStream:
    """Collects one stream (stdout or stderr) and forwards it to the parent in frames, within
    the call's output budget (:class:`sandboxd.rules.OutputBudget`, shared by stdout and
    stderr). Exceeding it raises :class:`LimitExceeded` (sticky)."""

    FLUSH_BYTES = 8192
    FLUSH_SECONDS = 0.02

    def __init__(self, kind: bytes, emit: Callable[[bytes, bytes], None],
                 budget: OutputBudget) -> None:
        self.kind = kind
        self.emit = emit
        self.budget = budget
        self.cap = budget.cap
        self.pending: list[bytes] = []
        self.pending_size = 0
        self.last_flush = -1e9
        self.truncated = False
        self.busy = False

    def write(self, text: str) -> int:
        if STATE.limit_hit is not None:
            raise STATE.limit_hit
        if not isinstance(text, str):
            raise TypeError("write() argument must be str")
        self.busy = True
        try:
            return self._write(text)
        finally:
            self.busy = False

    def tick(self) -> None:
        """Periodic flush (from a timer signal) unless a write is in progress, so that output
        printed before a hang or a kill reaches the parent."""
        if not self.busy and self.pending:
            self.busy = True
            try:
                self.flush()
            except BaseException:
                pass
            finally:
                self.busy = False

    def _write(self, text: str) -> int:
        data = text.encode("utf-8", "surrogateescape")
        room = self.budget.room()
        if len(data) > room:
            data = data[: max(room, 0)]
            # do not cut a UTF-8 sequence in half
            while data and (data[-1] & 0xC0) == 0x80:
                data = data[:-1]
            if data and data[-1] >= 0xC0:
                data = data[:-1]
            self._add(data)
            self.flush()
            self.truncated = self.budget.exceeded = True
            STATE.limit_hit = LimitExceeded(
                "output_limit", f"output limit of {self.cap} bytes exceeded"
            )
            raise STATE.limit_hit
        self._add(data)
        now = time.monotonic()
        if self.pending_size >= self.FLUSH_BYTES or now - self.last_flush >= self.FLUSH_SECONDS:
            self.flush()
            self.last_flush = now
        return len(text)

    def _add(self, data: bytes) -> None:
        if data:
            self.pending.append(data)
            self.pending_size += len(data)
            self.budget.used += len(data)

    def flush(self) -> None:
        if self.pending:
            data = b"".join(self.pending)
            self.pending.clear()
            self.pending_size = 0
            self.emit(self.kind, data)

    def flush_soon(self) -> None:
        """An explicit flush, at most every ``FLUSH_SECONDS`` (the timer flushes the rest):
        the daemon bounds the frames of a call, and nothing is streamed before its end."""
        now = time.monotonic()
        if now - self.last_flush >= self.FLUSH_SECONDS:
            self.flush()
            self.last_flush = now

    def write_raw(self, text: str) -> None:
        """For the runner's own messages (tracebacks): within the budget but never raising; a
        message cut by the cap ends the call with ``output_limit`` like any other output."""
        raw = text.encode("utf-8", "surrogateescape")
        data = raw[: self.budget.room()]
        if len(data) < len(raw):
            self.truncated = self.budget.exceeded = True
            if STATE.limit_hit is None:
                STATE.limit_hit = LimitExceeded(
                    "output_limit", f"output limit of {self.cap} bytes exceeded"
                )
        self._add(data)


class _PrintScope:
    """What ``_print_`` returns: RestrictedPython calls ``_print._call_print(...)``."""

    def __init__(self, stream: OutputStream) -> None:
        self.stream = stream

    def _call_print(self, *objects: Any, **kwargs: Any) -> None:
        target = kwargs.get("file")
        if target is not None:
            guarded_getattr(target, "write")
            builtins.print(*objects, **kwargs)
            return
        unknown = set(kwargs) - {"sep", "end", "flush", "file"}
        if unknown:
            raise TypeError(f"print() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        sep = kwargs.get("sep")
        end = kwargs.get("end")
        if sep is not None and not isinstance(sep, str):
            raise TypeError("sep must be None or a string")
        if end is not None and not isinstance(end, str):
            raise TypeError("end must be None or a string")
        # one write per print() call, so that a line is never split across flushes
        text = (" " if sep is None else sep).join([str(o) for o in objects])
        self.stream.write(text + ("\n" if end is None else end))
        if kwargs.get("flush"):
            self.stream.flush_soon()

    def __call__(self) -> str:  # the ``printed`` variable: not supported
        return ""


# ----------------------------------------------------------------- workspace open


class WorkspaceOpener:
    """``open`` confined to the workspace (paths as :func:`sandboxd.rules.normalise_path` accepts
    them, no symlinks leaving it), with a cap on the bytes a file may hold after writing
    (RLIMIT_FSIZE backs this)."""

    def __init__(self, root: str, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes

    def resolve(self, path: Any) -> str:
        if isinstance(path, bytes):
            path = bytes(path).decode("utf-8", "surrogateescape")
        if isinstance(path, str):
            path = _plain_str(path, "path")
        if not isinstance(path, str) or not path or "\x00" in path:
            raise SandboxViolation("open(): the path must be a non-empty string")
        try:  # the one workspace path rule (sandboxd.rules), then containment of the real path
            rel = normalise_path(path)
        except PathRefused as exc:
            raise SandboxViolation(f"open(): '{path}' is not allowed: {exc}") from None
        full = os.path.join(self.root, rel)
        real = os.path.realpath(full)
        root_real = os.path.realpath(self.root)
        if real != root_real and not real.startswith(root_real.rstrip("/") + "/"):
            raise SandboxViolation(f"open(): '{path}' leads outside the workspace")
        return real

    def __call__(
        self,
        file: Any,
        mode: str = "r",
        buffering: int = -1,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> Any:
        mode = _plain_str(mode, "mode")
        if set(mode) - set("rwaxbt+"):
            raise ValueError(f"open(): invalid mode {mode!r}")
        real = self.resolve(file)
        if "b" not in mode and encoding is None:
            encoding = "utf-8"
        return _CappedFile(
            builtins.open(real, mode, buffering, encoding, errors, newline),
            self.max_bytes,
            str(file),
        )


class _CappedFile:
    """A file object whose writes cannot grow the file past the cap."""

    __slots__ = ("_f", "_max", "_name")

    def __init__(self, f: Any, max_bytes: int, name: str) -> None:
        self._f = f
        self._max = max_bytes
        self._name = name

    def write(self, data: Any) -> int:
        if isinstance(data, str):
            data = _plain_str(data, "data")
            size = len(data.encode("utf-8", "surrogateescape"))
        else:
            data = bytes(memoryview(data))
            size = len(data)
        if self._f.tell() + size > self._max:
            raise OSError(f"file '{self._name}' would exceed the size limit of {self._max} bytes")
        return self._f.write(data)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def read(self, *args: Any) -> Any:
        return self._f.read(*args)

    def readline(self, *args: Any) -> Any:
        return self._f.readline(*args)

    def readlines(self, *args: Any) -> Any:
        return self._f.readlines(*args)

    def seek(self, *args: Any) -> Any:
        return self._f.seek(*args)

    def tell(self) -> int:
        return self._f.tell()

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed

    @property
    def name(self) -> str:
        return self._name

    @property
    def mode(self) -> str:
        return self._f.mode

    def __iter__(self) -> Any:
        return iter(self._f)

    def __enter__(self) -> _CappedFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._f.close()


# ----------------------------------------------------------------- builtins

_SAFE_BUILTIN_NAMES = [
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
_SAFE_EXCEPTIONS = [
    n
    for n in dir(builtins)
    if isinstance(getattr(builtins, n), type)
    and issubclass(getattr(builtins, n), BaseException)
    and n not in ("BaseExceptionGroup", "ExceptionGroup")
]


def make_builtins(import_hook: ImportHook, opener: WorkspaceOpener) -> dict[str, Any]:
    safe: dict[str, Any] = {n: getattr(builtins, n) for n in _SAFE_BUILTIN_NAMES}
    safe.update({n: getattr(builtins, n) for n in _SAFE_EXCEPTIONS})
    safe.update(
        __import__=import_hook,
        __build_class__=builtins.__build_class__,
        type=SafeType,
        getattr=guarded_getattr,
        hasattr=guarded_hasattr,
        setattr=guarded_setattr,
        delattr=guarded_delattr,
        open=opener,
    )
    return safe


def make_globals(
    import_hook: ImportHook, opener: WorkspaceOpener, stdout: OutputStream
) -> dict[str, Any]:
    """The globals dict user code runs in."""

    def print_factory(_getattr: Any = None) -> _PrintScope:
        return _PrintScope(stdout)

    def set_value(value: Any) -> None:
        STATE.value = value
        STATE.has_value = True

    return {
        "__builtins__": make_builtins(import_hook, opener),
        "__name__": "__main__",
        "__metaclass__": metaclass,
        "_getattr_": guarded_getattr,
        "_getitem_": guarded_getitem,
        "_getiter_": getiter,
        "_write_": guarded_write,
        "_inplacevar_": inplacevar,
        "_apply_": apply,
        "_print_": print_factory,
        "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
        "_unpack_sequence_": guarded_unpack_sequence,
        "_sbx_augattr_": augattr,
        "_sbx_augitem_": augitem,
        "_sbx_limit_check_": _limit_check,
        "_sbx_set_value_": set_value,
    }


# ----------------------------------------------------------------- runner


def format_user_traceback(exc: BaseException) -> str:
    """A traceback showing only frames of the user's code (no host paths)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == SANDBOX_FILENAME]
    lines = []
    if frames:
        lines.append("Traceback (most recent call last):\n")
        if len(frames) > 12:
            lines.extend(traceback.format_list(frames[:3]))
            lines.append(f"  [... {len(frames) - 9} more frames ...]\n")
            frames = frames[-6:]
        lines.extend(traceback.format_list(frames))
    lines.extend(traceback.format_exception_only(type(exc), exc))
    return "".join(lines)


def encode_value(value: Any, cap: int) -> tuple[Any, str | None]:
    """The last expression's value: itself if JSON-serialisable, else its repr (capped)."""
    if value is None:
        return None, None
    try:
        text = json.dumps(value, allow_nan=False)
        if len(text) <= cap:
            return json.loads(text), None
        return None, f"value omitted: its JSON is larger than the output limit ({cap} bytes)"
    except (TypeError, ValueError, RecursionError, OverflowError):
        pass
    try:
        text = repr(value)
    except Exception as exc:  # user __repr__ failed
        return None, f"value omitted: repr() failed: {type(exc).__name__}: {exc}"
    # the report carries it JSON-escaped (up to 12 bytes a character): keep that within cap
    text = text[:cap]
    while len(encoded := json.dumps(text)) > cap and text:
        text = text[: max(0, len(text) * cap // len(encoded) - 1)]
    return text, None


def run_user_code(
    source: str,
    *,
    imports_allow: list[str],
    imports_deny: list[str],
    workspace: str,
    output_bytes: int,
    max_file_bytes: int,
    emit: Callable[[bytes, bytes], None],
) -> dict[str, Any]:
    """Compile and run ``source``; stream output through ``emit(kind, data)``; return the final
    report ``{"outcome", "exit_code", "value", ...}``. Never raises (except on a broken emit)."""
    budget = OutputBudget(output_bytes)  # one cap for stdout and stderr together
    stdout = OutputStream(b"o", emit, budget)
    _Stdout.stream = stdout
    stderr = OutputStream(b"e", emit, budget)
    STATE.limit_hit, STATE.memory_hit, STATE.value, STATE.has_value = None, False, None, False
    reserve = bytearray(1 << 16)  # released on MemoryError so that reporting can work
    report: dict[str, Any] = {"outcome": "ok", "exit_code": 0, "value": None}
    code, errors = compile_user_code(source)
    if code is None:
        stderr.write_raw(
            "Your code was refused by the sandbox compiler:\n" + "\n".join(errors) + "\n"
        )
        stderr.flush()
        report.update(outcome="error", exit_code=1, message="compile error")
        return report
    linecache.cache[SANDBOX_FILENAME] = (
        len(source),
        None,
        source.splitlines(True),
        SANDBOX_FILENAME,
    )
    g = make_globals(
        ImportHook(imports_allow, imports_deny), WorkspaceOpener(workspace, max_file_bytes), stdout
    )
    old_alarm = signal.signal(signal.SIGALRM, lambda *_: stdout.tick())
    signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
    try:
        exec(code, g)
    except MemoryError:
        del reserve
        g.clear()
        STATE.memory_hit = True
    except LimitExceeded:
        pass
    except SystemExit as exc:
        code_ = exc.code
        if code_ is None:
            report["exit_code"] = 0
        elif isinstance(code_, int):
            report["exit_code"] = code_ & 0xFF
        else:
            stderr.write_raw(f"{code_}\n")
            report["exit_code"] = 1
        if report["exit_code"] != 0:
            report.update(outcome="error", message="SystemExit")
    except BaseException as exc:  # user exceptions, KeyboardInterrupt, GeneratorExit...
        try:
            stderr.write_raw(format_user_traceback(exc))
        except BaseException:
            stderr.write_raw(f"{type(exc).__name__}\n")
        report.update(outcome="error", exit_code=1, message=f"{type(exc).__name__}")
    if STATE.memory_hit:
        report.update(outcome="memory_limit", exit_code=1)
        stderr.write_raw("MemoryError: the memory limit was exceeded\n")
    elif STATE.limit_hit is not None:
        report.update(outcome=STATE.limit_hit.reason, exit_code=1, message=str(STATE.limit_hit))
    elif report["outcome"] == "ok" and STATE.has_value:
        try:
            report["value"], note = encode_value(STATE.value, output_bytes)
        except BaseException as exc:
            report["value"], note = None, f"value omitted: {type(exc).__name__}"
        if note:
            stderr.write_raw(note + "\n")
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old_alarm)
    report["truncated_stdout"] = stdout.truncated
    stdout.flush()
    stderr.flush()
    return report
