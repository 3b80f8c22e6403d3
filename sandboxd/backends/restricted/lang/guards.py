"""Run-time guards of user code: attribute, item, iteration and write guards, the guarded
``str.format``, the class factory recording user classes and the one-argument ``type``.

Host objects (an attribute walk from one must not reach the daemon's internals): every object
of a class defined in the daemon's own package that user code can hold (``display``, ``open`` and
its files, the import hook, output streams...)
exposes only the attributes its class declares with :func:`expose` - nothing when it declares
none. Default deny: a host class nobody declared exposes nothing, so a new helper handed to
user code cannot lead to the worker's result channel by accident.
"""

from __future__ import annotations

import _string
import functools
import operator
import string
import types
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from sandboxd.backends.restricted.lang.allowlist import (
    ALLOWED_DUNDER_READS,
    ALLOWED_METACLASSES,
    BLOCKED_OBJECT_TYPES,
    FORBIDDEN_ATTRS,
    GENERATOR_ATTRS,
    GENERATOR_TYPES,
    MUTABLE_CONTAINERS,
    WRITABLE_HOST_TYPES,
    is_private_attr,
)
from sandboxd.backends.restricted.lang.proxy import ModuleProxy
from sandboxd.backends.restricted.lang.state import SANDBOX_FILENAME, SandboxViolation

_T = TypeVar("_T", bound=type)
#: host class -> the only attributes its objects show user code (see the module docs)
HOST_SURFACES: dict[type, frozenset[str]] = {}
#: the package whose classes are host classes
HOST_PACKAGE = "sandboxd."


def expose(*names: str) -> Callable[[_T], _T]:
    """Class decorator: objects of this host class show user code ``names`` and nothing else
    (no names: only their call)."""
    def register(cls: _T) -> _T:
        HOST_SURFACES[cls] = frozenset(names)
        return cls
    return register


def host_surface(obj: Any) -> frozenset[str] | None:
    """The attributes user code may read on ``obj`` when it is a host object (its class
    comes from the daemon's package and was not created by user code), else ``None``.
    Module proxies have their own rule (their allowlisted names)."""
    cls = type(obj)
    surface = HOST_SURFACES.get(cls)
    if surface is not None:
        return surface
    if isinstance(obj, ModuleProxy) or is_user_class(cls):
        return None
    module = cls.__dict__.get("__module__")
    if isinstance(module, str) and module.startswith(HOST_PACKAGE):
        return frozenset()
    return None


@expose()
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


user_classes: weakref.WeakSet[type] = weakref.WeakSet()


def is_user_class(cls: type) -> bool:
    try:
        return cls in user_classes
    except TypeError:
        return False


def _is_user_object(obj: Any) -> bool:
    t = type(obj)
    if is_user_class(t):
        return True
    if isinstance(obj, type) and is_user_class(obj):
        return True
    if t is types.FunctionType:  # (not isinstance: that would believe a faked __class__)
        code: types.CodeType = obj.__code__
        return code.co_filename == SANDBOX_FILENAME
    return False


def refuse(what: str) -> SandboxViolation:
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
    if isinstance(value, (types.ModuleType, BLOCKED_OBJECT_TYPES)):
        raise refuse(f"access to {type(value).__name__} objects")
    return _guard_formatting(value)


_MISSING = object()


def plain_str(value: Any, what: str) -> str:
    """An exact ``str`` copy: a user ``str`` subclass could override ``startswith``,
    ``__eq__`` or ``__hash__`` to pass a check with one value and be used with another."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string")
    return str.__str__(value) if type(value) is not str else value


def guarded_getattr(obj: Any, name: Any, default: Any = _MISSING) -> Any:
    """``getattr`` for user code (and the ``getattr`` builtin)."""
    name = plain_str(name, "attribute name")
    if name.startswith("_"):
        if name in ALLOWED_DUNDER_READS or (is_private_attr(name) and _is_user_object(obj)):
            pass
        else:
            raise refuse(f"access to attribute '{name}'")
    if name in FORBIDDEN_ATTRS:
        raise refuse(f"access to attribute '{name}'")
    surface = host_surface(obj)
    if surface is not None and not name.startswith("_") and name not in surface:
        raise refuse(f"access to attribute '{name}' of the sandbox's own "
                     f"{type(obj).__name__.lstrip('_')} object")
    if isinstance(obj, BLOCKED_OBJECT_TYPES):
        raise refuse(f"access to {type(obj).__name__} internals")
    if isinstance(obj, GENERATOR_TYPES) and name not in GENERATOR_ATTRS:
        raise refuse(f"access to {type(obj).__name__} internals")
    if (
        isinstance(obj, type)
        and issubclass(obj, string.Formatter)
        and obj is not SafeFormatter
        and not is_user_class(obj)
    ):
        raise refuse("string.Formatter")
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
    if t in MUTABLE_CONTAINERS or t in WRITABLE_HOST_TYPES or _is_user_object(obj):
        return obj
    if isinstance(obj, ModuleProxy):
        raise SandboxViolation("modules cannot be modified in the sandbox")
    raise SandboxViolation(
        f"cannot modify {t.__name__} objects in the sandbox: only objects created by your "
        f"code can be modified"
    )


def guarded_setattr(obj: Any, name: str, value: Any) -> None:
    name = plain_str(name, "attribute name")
    if name.startswith("_") and not is_private_attr(name):
        raise refuse(f"setting attribute '{name}'")
    setattr(guarded_write(obj), name, value)


def guarded_delattr(obj: Any, name: str) -> None:
    name = plain_str(name, "attribute name")
    if name.startswith("_") and not is_private_attr(name):
        raise refuse(f"deleting attribute '{name}'")
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
    if meta not in ALLOWED_METACLASSES:
        raise refuse(f"classes with the metaclass {meta.__name__}")
    if meta is type:
        cls = type(name, bases, namespace)
    else:
        prepared = meta.__prepare__(name, bases)
        for key, value in namespace.items():
            prepared[key] = value
        cls = meta(name, bases, prepared)
    user_classes.add(cls)
    return cls


@expose()
class _TypeMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, type)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return isinstance(sub, type) and issubclass(sub, type)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) != 1 or kwargs:
            raise refuse("type() with more than one argument")
        result = type(args[0])
        # the type of a class is a metaclass (``type`` itself, EnumType...), which would create
        # classes when called with three arguments: hand out this guarded ``type`` instead
        return cls if issubclass(result, type) else result


class SafeType(metaclass=_TypeMeta):
    """``type(x)`` only; isinstance(cls, type) keeps working."""
