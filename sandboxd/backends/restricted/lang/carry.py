"""A session kernel's state carried to its forks: serialised inside the parent's sandbox,
restored inside each fork's (the daemon only relays the bytes, never unpickles them).

**Serialising** (:func:`snapshot`, in the parent kernel, between calls): the user's names of
the kernel's namespace (every name user code can bind: restricted code cannot bind a name
that starts with ``_``, so the guards, ``__builtins__`` and the print collector are left out
and rebuilt in the fork) are pickled with cloudpickle: functions, lambdas and classes defined
in the session by value, modules by reference (a module proxy is its name: the fork's own
import hook hands out a fresh one, under the fork's policy), module values (``math.pi``'s
function, ``datetime.date``) by reference only when an allowed module's proxy exposes them.
Every function's globals is *the namespace itself*, by reference: in the fork, functions are
rebuilt on the fork's namespace, so one defined before the fork reads a global changed
after it in that fork. A name that cannot be pickled (an open file, a generator, a bound
method of a host object...) is named with why, and the others are carried together (one
pickle: what they share stays shared). The bytes are written to a bounded buffer: more than
the limit stops the pickling there, and nothing is carried.

**Restoring** (:func:`restore`, in the fork's fresh kernel, confined, before its first call):
an unpickler whose ``find_class`` admits only cloudpickle's reconstructors (the ones that
touch globals or builtins replaced by ours, which never hand out the host's builtins),
the safe builtins and what an allowed module's proxy exposes; classes rebuilt are recorded
as user classes (the ``_write_`` guard lets their code mutate them as before). The bytes
come from the parent's sandbox, which is confined as this one is; the allowlist keeps what
its honest pickler writes within what its code could reach, and the process layer is the
boundary for the rest.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import sys
import types
from collections.abc import Callable
from typing import Any

import cloudpickle
from cloudpickle import cloudpickle as _cp

from sandboxd.backends.restricted.lang import module_state
from sandboxd.backends.restricted.lang.allowlist import (
    ALLOWED_METACLASSES,
    SAFE_BUILTIN_NAMES,
    SAFE_EXCEPTIONS,
)
from sandboxd.backends.restricted.lang.guards import user_classes
from sandboxd.backends.restricted.lang.module_allowlist import MODULES
from sandboxd.backends.restricted.lang.modules import ImportHook, make_proxy
from sandboxd.backends.restricted.lang.proxy import ModuleProxy

#: the key of the modules' state beside the names (no name can take it: not an identifier)
MODULES_KEY = "\x00modules"

#: the longest reason a name is not carried for (the report bounds it again)
MAX_WHY = 200
#: the names left out a report lists (beyond: one entry says how many more), and the
#: longest name it shows: a report stays far within its bounds (protocol.call) whatever the
#: namespace holds, so that a namespace never makes the kernel break its protocol
MAX_REPORTED = 256
MAX_NAME = 200
_METAS: tuple[type, ...] = tuple(sorted(ALLOWED_METACLASSES, key=lambda m: m.__qualname__))
#: cloudpickle's reconstructors a pickle of user state names (:class:`_Unpickler` admits
#: these only, those touching globals, builtins or metaclasses replaced by its own)
RECONSTRUCTORS = ("_make_function", "_function_setstate", "_make_skeleton_class",
                  "_make_skeleton_enum", "_class_setstate", "_make_empty_cell", "_make_cell",
                  "_builtin_type", "_make_dict_keys", "_make_dict_values", "_make_dict_items")
_RECONSTRUCTOR_IDS = frozenset(id(getattr(_cp, n)) for n in RECONSTRUCTORS)
#: the host types cloudpickle rebuilds a function or a bound method with (references)
_HOST_TYPES: dict[str, type] = {"CodeType": types.CodeType, "CellType": types.CellType,
                                "MethodType": types.MethodType}


class TooLarge(Exception):
    """The pickled state grew past the limit."""


class _Bounded(io.RawIOBase):
    """A write-only sink that refuses to grow past ``limit`` bytes. It keeps what pickle
    writes as it is (a large value's payload is a view of the value itself: not copied, it
    is written out from there once the pickling is done, before any user code runs again)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.parts: list[Any] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        if self.size + n > self.limit:
            raise TooLarge(f"the pickled state is larger than {self.limit} bytes")
        # small writes are pickle's own frame buffers, reused by it: those are copied
        self.parts.append(data if n >= 1 << 16 else bytes(data))
        self.size += n
        return n


class Pickled:
    """A pickled state: its parts in order (see :class:`_Bounded`) and its size."""

    def __init__(self, parts: list[Any], size: int) -> None:
        self.parts = parts
        self.size = size

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)


def user_names(namespace: dict[str, Any]) -> list[str]:
    """The names of ``namespace`` user code bound (it cannot bind ``_``-names)."""
    return [n for n in namespace if type(n) is str and not n.startswith("_")]


def _exposed(hook: ImportHook) -> dict[int, Any]:
    """``{id: value}`` of what user code may hold by reference: the safe builtins and every
    value an allowed module's proxy exposes."""
    import builtins

    values: list[Any] = [getattr(builtins, n) for n in (*SAFE_BUILTIN_NAMES, *SAFE_EXCEPTIONS)]
    for name in MODULES:
        if hook.allowed(name):
            values.extend(make_proxy(name).__dict__.values())
    return {id(v): v for v in values}


def _by_reference(obj: Any) -> bool:
    """``obj`` is one of the kinds pickle saves as a reference to a module's attribute."""
    return isinstance(obj, type | types.FunctionType | types.BuiltinFunctionType
                      | types.MethodType)


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, with the kernel's namespace, module proxies and metaclasses as
    references, and with every reference to a host value checked against what an allowed
    module exposes."""

    def __init__(self, file: Any, namespace: dict[str, Any], exposed: dict[int, Any]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.namespace = namespace
        self.exposed = exposed

    def persistent_id(self, obj: Any) -> Any:
        if obj is self.namespace:
            return "ns"
        if isinstance(obj, ModuleProxy):
            return ("module", obj.__dict__["__name__"])
        if type(obj) is type or (isinstance(obj, type) and type(obj) in ALLOWED_METACLASSES):
            return self._class_id(obj)
        if _by_reference(obj) and not (isinstance(obj, types.FunctionType)
                                       and obj.__globals__ is self.namespace):
            return self._function_id(obj)
        return None

    def _class_id(self, cls: type) -> Any:
        """A class: a host type cloudpickle needs and an allowed metaclass by reference, a
        user class or one an allowed module exposes by value (None); any other class of the
        host is refused."""
        known = next((name for name, host in _HOST_TYPES.items() if cls is host), None)
        if known is not None:
            return ("type", known)
        if cls in _METAS:
            return ("meta", _METAS.index(cls))
        if cls in user_classes or id(cls) in self.exposed:
            return None
        raise pickle.PicklingError(f"{cls.__qualname__} is a class of the host")

    def _function_id(self, func: Any) -> None:
        """A function not of the namespace: pickled as cloudpickle does when an allowed
        module exposes it or it is one of cloudpickle's reconstructors; else refused."""
        if id(func) in self.exposed or id(func) in _RECONSTRUCTOR_IDS:
            return None
        name = getattr(func, "__qualname__", type(func).__name__)
        raise pickle.PicklingError(f"{name} is a function of the host")

    def _function_getnewargs(self, func: Any) -> Any:
        if func.__globals__ is not self.namespace:  # checked above: never reached
            raise pickle.PicklingError("a function of foreign globals")
        closure = (None if func.__closure__ is None else
                   tuple(_cp._make_empty_cell() for _ in func.__code__.co_freevars))
        return func.__code__, self.namespace, None, None, closure

    def _dynamic_function_reduce(self, func: Any) -> Any:
        state, slotstate = _cp._function_getstate(func)
        slotstate["__globals__"] = {k: v for k, v in slotstate["__globals__"].items()
                                    if not k.startswith("_")}
        slotstate["_cloudpickle_submodules"] = []
        return (_cp._make_function, self._function_getnewargs(func), (state, slotstate),
                None, None, _cp._function_setstate)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:MAX_WHY]


def reported(not_carried: dict[str, str]) -> dict[str, str]:
    """``not_carried`` as a report lists it (see :data:`MAX_REPORTED`)."""
    shown = {name[:MAX_NAME]: why for name, why in list(not_carried.items())[:MAX_REPORTED]}
    if len(not_carried) > MAX_REPORTED:
        shown["..."] = f"and {len(not_carried) - MAX_REPORTED} more names not carried"
    return shown


def _dump(obj: Any, namespace: dict[str, Any], exposed: dict[int, Any],
          limit: int) -> Pickled:
    sink = _Bounded(limit)
    _Pickler(sink, namespace, exposed).dump(obj)
    return Pickled(sink.parts, sink.size)


def _dump_or_why(obj: Any, namespace: dict[str, Any], exposed: dict[int, Any],
                 limit: int) -> Pickled | str:
    """:func:`_dump`, or why ``obj`` cannot be pickled; going past the limit raises
    :class:`TooLarge` (nothing is carried then)."""
    try:
        return _dump(obj, namespace, exposed, limit)
    except TooLarge:
        raise
    except Exception as exc:
        return _why(exc)


def snapshot(namespace: dict[str, Any], hook: ImportHook,
             limit: int) -> tuple[Pickled | None, dict[str, str], str | None]:
    """``(blob, not_carried, error)``: the pickled user names of ``namespace`` (``None`` and
    ``error`` when nothing can be carried), and ``{name: why}`` for those left out."""
    exposed = _exposed(hook)
    names = user_names(namespace)
    not_carried: dict[str, str] = {}
    modules = {MODULES_KEY: module_state.capture()}  # (a woken kernel applies it; a fork not)
    try:
        whole = _dump_or_why({**{n: namespace[n] for n in names}, **modules}, namespace,
                             exposed, limit)
        if isinstance(whole, Pickled):
            return whole, {}, None
        # find the culprits one by one, then carry the others together
        for name in names:
            alone = _dump_or_why(namespace[name], namespace, exposed, limit)
            if not isinstance(alone, Pickled):
                not_carried[name] = alone
        kept = {**{n: namespace[n] for n in names if n not in not_carried}, **modules}
        return _dump(kept, namespace, exposed, limit), not_carried, None
    except TooLarge as exc:
        return None, not_carried, str(exc)
    except MemoryError:
        return None, not_carried, "the kernel's memory limit was reached while pickling"
    except Exception as exc:  # a failure of the names together only
        return None, not_carried, f"the state could not be pickled: {_why(exc)}"


#: why a reference the state names is refused
_UNKNOWN_REFERENCE = "an unknown reference in the state"


def _fill_cells(cells: tuple[Any, ...], restored: Any) -> None:
    """A restored function's closure: each cell takes its restored cell's contents (an empty
    cell stays empty)."""
    for cell, new in zip(cells, restored, strict=False):
        with contextlib.suppress(ValueError):
            cell.cell_contents = new.cell_contents


class _MetaToken:
    """A metaclass, as a restored pickle holds it: only a class skeleton unwraps it."""

    __slots__ = ("meta",)

    def __init__(self, meta: type) -> None:
        self.meta = meta


class _Unpickler(pickle.Unpickler):
    """An unpickler admitting only what :func:`snapshot` writes for user state."""

    def __init__(self, file: Any, namespace: dict[str, Any], hook: ImportHook) -> None:
        super().__init__(file)
        self.namespace = namespace
        self.hook = hook
        self.exposed = _exposed(hook)
        replaced = {"_make_function": self._make_function,
                    "_function_setstate": self._function_setstate,
                    "_make_skeleton_class": self._make_skeleton_class,
                    "_make_skeleton_enum": self._make_skeleton_enum,
                    "_builtin_type": self._builtin_type}
        self.own = {n: replaced.get(n) or getattr(_cp, n) for n in RECONSTRUCTORS}
        #: the references of the state (see :meth:`_Pickler.persistent_id`), by their tag
        self.references: dict[str, Callable[[Any], Any]] = {
            "module": self._module, "meta": self._metaclass, "type": self._host_type}

    def persistent_load(self, pid: Any) -> Any:
        if pid == "ns":
            return self.namespace
        if type(pid) is tuple and len(pid) == 2 and type(pid[0]) is str:
            load = self.references.get(pid[0])
            if load is not None:
                return load(pid[1])
        raise pickle.UnpicklingError(_UNKNOWN_REFERENCE)

    def _module(self, name: Any) -> Any:
        """A module reference: the proxy this kernel's import hook hands out (under its
        policy)."""
        if type(name) is not str:
            raise pickle.UnpicklingError(_UNKNOWN_REFERENCE)
        return self.hook(name, None, None, (), 0)

    @staticmethod
    def _metaclass(index: Any) -> _MetaToken:
        """An allowed metaclass, by its place in :data:`_METAS`."""
        if type(index) is not int or not 0 <= index < len(_METAS):
            raise pickle.UnpicklingError(_UNKNOWN_REFERENCE)
        return _MetaToken(_METAS[index])

    @staticmethod
    def _host_type(name: Any) -> type:
        """One of the host types cloudpickle rebuilds functions with."""
        if name not in _HOST_TYPES:
            raise pickle.UnpicklingError(_UNKNOWN_REFERENCE)
        return _HOST_TYPES[name]

    def find_class(self, module: str, name: str) -> Any:
        if module == "cloudpickle.cloudpickle" and name in self.own:
            return self.own[name]
        host = sys.modules.get(module)  # never imports anything
        obj: Any = host
        for part in name.split("."):
            obj = getattr(obj, part, None) if obj is not None else None
        if obj is None or id(obj) not in self.exposed:
            raise pickle.UnpicklingError(f"{module}.{name} may not be restored in the sandbox")
        return obj

    def _make_function(self, code: Any, globals_: Any, name: Any, argdefs: Any,
                       closure: Any) -> types.FunctionType:
        if globals_ is not self.namespace or type(code) is not types.CodeType:
            raise pickle.UnpicklingError("a function of foreign globals")
        return types.FunctionType(code, self.namespace, name, argdefs, closure)

    def _function_setstate(self, func: Any, state: Any) -> None:
        if type(func) is not types.FunctionType or func.__globals__ is not self.namespace:
            raise pickle.UnpicklingError("a function state for a foreign object")
        state, slotstate = state
        func.__dict__.update(state)
        for key, value in slotstate.pop("__globals__").items():
            if type(key) is str and not key.startswith("_"):
                self.namespace[key] = value
        closure = slotstate.pop("__closure__")
        slotstate.pop("_cloudpickle_submodules", None)
        if closure is not None:
            _fill_cells(func.__closure__ or (), closure)
        for key in ("__name__", "__qualname__", "__annotations__", "__kwdefaults__",
                    "__defaults__", "__module__", "__doc__"):
            if key in slotstate:
                setattr(func, key, slotstate[key])

    @staticmethod
    def _builtin_type(name: Any) -> Any:
        if type(name) is not str or name not in _HOST_TYPES:
            raise pickle.UnpicklingError(f"the type {name!r} may not be restored")
        return _HOST_TYPES[name]

    @staticmethod
    def _meta(token: Any) -> type:
        if type(token) is not _MetaToken:
            raise pickle.UnpicklingError("a class of an unknown metaclass")
        return token.meta

    def _make_skeleton_class(self, meta: Any, *args: Any) -> type:
        cls: type = _cp._make_skeleton_class(self._meta(meta), *args)
        user_classes.add(cls)
        return cls

    def _make_skeleton_enum(self, bases: Any, *args: Any) -> type:
        cls: type = _cp._make_skeleton_enum(bases, *args)
        if type(cls) not in ALLOWED_METACLASSES:
            raise pickle.UnpicklingError("an enum of an unknown metaclass")
        user_classes.add(cls)
        return cls


class _InPlace:
    """The pickled state as the unpickler's file, read where it lies (``io.BytesIO`` shares a
    ``bytes`` but copies a ``bytearray``, which a received state is): a large value's payload
    goes once, from here into the value's own buffer (``readinto``)."""

    def __init__(self, data: bytes | bytearray) -> None:
        self._data = data
        self._view = memoryview(data)
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n < 0 else min(len(self._data), self._pos + n)
        out = self._view[self._pos : end].tobytes()
        self._pos = end
        return out

    def readinto(self, target: Any) -> int:
        with memoryview(target) as into, into.cast("B") as flat:
            n = min(len(flat), len(self._data) - self._pos)
            flat[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def readline(self) -> bytes:
        end = self._data.find(b"\n", self._pos)
        return self.read(-1 if end < 0 else end + 1 - self._pos)


def restore(namespace: dict[str, Any], blob: bytes | bytearray, hook: ImportHook, *,
            woken: bool = False) -> list[str]:
    """Put the names pickled in ``blob`` into ``namespace`` (whose trusted entries are set
    already: restoring may run user code, e.g. a class's ``__eq__`` for a set); ``woken``
    (the kernel's own state from before it was hibernated): the modules' state too
    (:mod:`.module_state`). Returns the names restored; raises on anything
    :class:`_Unpickler` refuses (nothing is put in then)."""
    try:
        loaded = _Unpickler(_InPlace(blob), namespace, hook).load()
        if type(loaded) is not dict:
            raise pickle.UnpicklingError("the state is not a namespace")
        modules = loaded.pop(MODULES_KEY, None)
        if not all(type(k) is str and not k.startswith("_") for k in loaded):
            raise pickle.UnpicklingError("the state is not a namespace")
        if woken and modules is not None:
            module_state.apply(modules)
    except BaseException:
        for name in user_names(namespace):  # what functions' states put in already
            del namespace[name]
        raise
    namespace.update(loaded)
    return list(loaded)
